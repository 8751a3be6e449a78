"""`mlxcel codex-config`: the Codex provider block, printed or merged into config.toml."""

from __future__ import annotations

import json
import tomllib
from pathlib import Path
from typing import Any

import pytest

from mlxcel.cli.codex import main
from mlxcel.cli.main import main as mlxcel_main

EXISTING = """\
# my settings
approval_policy = "on-request"  # keep asking

[model_providers.other]
name = "Other"
base_url = "https://example.invalid/v1"

[model_providers.mlxcel]
name = "stale"
base_url = "http://127.0.0.1:1/v1"
query_params = { stale = "yes" }

[profiles.fast]
model = "o3"
"""


def model_folder(tmp_path: Path, window: int = 4096) -> Path:
    folder = tmp_path / "Tiny-Model"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({"max_position_embeddings": window}))
    return folder


def printed(capsys: pytest.CaptureFixture[str], *argv: str) -> dict[str, Any]:
    assert main(list(argv), {}) == 0
    return tomllib.loads(capsys.readouterr().out)


def test_the_block_names_the_server_and_its_model(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = printed(capsys, "--model", str(model_folder(tmp_path)), "--port", "9123")
    assert config["model"] == "Tiny-Model"
    assert config["model_provider"] == "mlxcel"
    assert config["model_context_window"] == 4096
    assert config["web_search"] == "disabled"
    assert config["model_providers"]["mlxcel"] == {
        "name": "mlxcel",
        "base_url": "http://127.0.0.1:9123/v1",
        "wire_api": "responses",
        "stream_idle_timeout_ms": 30 * 60 * 1000,
        "stream_max_retries": 2,
        "request_max_retries": 4,
    }


def test_flags_and_environment_shape_the_block(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    folder = str(model_folder(tmp_path))
    argv = ["--model", folder, "--alias", "coder", "--ctx-size", "2048", "--api-key", "k"]
    config = printed(capsys, *argv, "--host", "0.0.0.0")
    assert (config["model"], config["model_context_window"]) == ("coder", 2048)
    provider = config["model_providers"]["mlxcel"]
    assert provider["env_key"] == "MLXCEL_API_KEY"
    assert provider["base_url"] == "http://127.0.0.1:8080/v1"  # everywhere: reached locally
    config = printed(capsys, "--model", folder, "--base-url", "http://box.lan:1/v1")
    assert config["model_providers"]["mlxcel"]["base_url"] == "http://box.lan:1/v1"
    assert main(["--model", folder], {"LLAMA_ARG_PORT": "7000"}) == 0
    assert "127.0.0.1:7000/v1" in capsys.readouterr().out


def test_an_unreadable_model_leaves_the_window_to_codex(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["--model", str(tmp_path / "nowhere")], {}) == 0
    out, err = capsys.readouterr()
    config = tomllib.loads(out)
    assert config["model"] == "nowhere"
    assert "model_context_window" not in config
    assert "no context window" in err


def test_write_merges_keeps_the_rest_and_is_idempotent(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    home = tmp_path / "codex"
    home.mkdir()
    (home / "config.toml").write_text(EXISTING)
    argv = ["--model", str(model_folder(tmp_path)), "--write"]
    assert main(argv, {"CODEX_HOME": str(home)}) == 0
    first = (home / "config.toml").read_text()
    assert "# my settings" in first
    assert "# keep asking" in first
    config = tomllib.loads(first)
    assert config["approval_policy"] == "on-request"
    assert config["model_providers"]["other"]["name"] == "Other"
    assert config["profiles"]["fast"] == {"model": "o3"}
    assert config["model_provider"] == "mlxcel"
    assert config["model"] == "Tiny-Model"
    ours = config["model_providers"]["mlxcel"]
    assert ours["name"] == "mlxcel"
    assert "query_params" not in ours  # our table is replaced whole
    assert main(argv, {"CODEX_HOME": str(home)}) == 0
    assert (home / "config.toml").read_text() == first
    assert capsys.readouterr().out == ""


def test_write_creates_a_missing_home(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    home = tmp_path / "new" / "codex"
    assert main(["--model", str(model_folder(tmp_path)), "--write"], {"CODEX_HOME": str(home)}) == 0
    config = tomllib.loads((home / "config.toml").read_text())
    assert config["model_providers"]["mlxcel"]["wire_api"] == "responses"
    assert str(home / "config.toml") in capsys.readouterr().err


def test_a_broken_config_is_left_alone(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    home = tmp_path / "codex"
    home.mkdir()
    (home / "config.toml").write_text("model = [unclosed\n")
    assert main(["--write"], {"CODEX_HOME": str(home)}) == 2
    assert "not valid TOML" in capsys.readouterr().err
    assert (home / "config.toml").read_text() == "model = [unclosed\n"


def test_bad_flags_are_a_clear_error(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        main(["--port", "eighty"], {})
    assert exit_.value.code == 2
    assert "--port" in capsys.readouterr().err
    assert main(["--port", "70000"], {}) == 2
    assert "--port" in capsys.readouterr().err


def test_mlxcel_lists_and_runs_the_command(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert mlxcel_main(["--help"]) == 0
    assert "codex-config" in capsys.readouterr().out
    assert mlxcel_main(["codex-config", "--model", str(model_folder(tmp_path))]) == 0
    assert tomllib.loads(capsys.readouterr().out)["model"] == "Tiny-Model"
