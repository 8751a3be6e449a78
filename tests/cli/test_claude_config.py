"""`mlxcel claude-config`: Claude Code's `env` block, printed or merged into its
settings.json."""

from __future__ import annotations

import json
import stat
from pathlib import Path
from typing import Any

import pytest

from mlxcel.cli.claude import main
from mlxcel.cli.main import main as mlxcel_main

EXISTING = {
    "permissions": {"allow": ["Bash(ls:*)"]},
    "env": {"EDITOR": "vim", "ANTHROPIC_MODEL": "stale", "API_TIMEOUT_MS": "1"},
    "theme": "dark",
}
TIERS = (
    "ANTHROPIC_MODEL",
    "ANTHROPIC_DEFAULT_OPUS_MODEL",
    "ANTHROPIC_DEFAULT_SONNET_MODEL",
    "ANTHROPIC_DEFAULT_HAIKU_MODEL",
    "ANTHROPIC_SMALL_FAST_MODEL",
    "CLAUDE_CODE_SUBAGENT_MODEL",
)


def model_folder(tmp_path: Path) -> Path:
    folder = tmp_path / "Tiny-Model"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({"max_position_embeddings": 4096}))
    return folder


def printed(
    capsys: pytest.CaptureFixture[str], *argv: str, environ: dict[str, str] | None = None
) -> dict[str, str]:
    assert main(list(argv), environ or {}) == 0
    settings: dict[str, Any] = json.loads(capsys.readouterr().out)
    assert list(settings) == ["env"]
    env: dict[str, str] = settings["env"]
    return env


def test_the_block_names_the_server_and_its_model_for_every_tier(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    env = printed(capsys, "--model", str(model_folder(tmp_path)), "--port", "9123")
    assert env["ANTHROPIC_BASE_URL"] == "http://127.0.0.1:9123"  # no /v1: Claude Code adds it
    assert {env[name] for name in TIERS} == {"Tiny-Model"}
    assert env["ANTHROPIC_AUTH_TOKEN"] == "no-key"  # it refuses to start without one
    assert env["CLAUDE_CODE_ATTRIBUTION_HEADER"] == "0"
    assert env["CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC"] == "1"
    assert env["API_TIMEOUT_MS"] == str(30 * 60 * 1000)
    assert all(isinstance(value, str) for value in env.values())


def test_flags_and_environment_shape_the_block(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    folder = str(model_folder(tmp_path))
    env = printed(capsys, "--model", folder, "--alias", "coder", "--host", "0.0.0.0")
    assert env["ANTHROPIC_MODEL"] == "coder"
    assert env["ANTHROPIC_BASE_URL"] == "http://127.0.0.1:8080"  # everywhere: reached locally
    for given in ("http://box.lan:1", "http://box.lan:1/", "http://box.lan:1/v1"):
        env = printed(capsys, "--model", folder, "--base-url", given)
        assert env["ANTHROPIC_BASE_URL"] == "http://box.lan:1"
    env = printed(capsys, "--model", folder, environ={"LLAMA_ARG_PORT": "7000"})
    assert env["ANTHROPIC_BASE_URL"] == "http://127.0.0.1:7000"


def test_a_server_with_keys_gets_the_key_to_send(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    folder = str(model_folder(tmp_path))
    env = printed(capsys, "--model", folder, "--api-key", "k1,k2")
    assert env["ANTHROPIC_AUTH_TOKEN"] == "k1"
    env = printed(capsys, "--model", folder, "--api-key", "k1", environ={"MLXCEL_API_KEY": "k2"})
    assert env["ANTHROPIC_AUTH_TOKEN"] == "k2"  # the one the user picked
    keys = tmp_path / "keys"
    keys.write_text("alice:sk-alice\n")
    assert main(["--model", folder, "--api-key-file", str(keys)], {}) == 2
    assert "export MLXCEL_API_KEY" in capsys.readouterr().err
    env = printed(
        capsys, "--model", folder, "--api-key-file", str(keys), environ={"MLXCEL_API_KEY": "x"}
    )
    assert env["ANTHROPIC_AUTH_TOKEN"] == "x"


def test_an_unfetched_default_model_still_gets_its_name(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(
        "mlxcel.model.provision.fetch.default_model_dir", lambda: tmp_path / "not-there"
    )
    assert printed(capsys)["ANTHROPIC_MODEL"] == "qwen2.5-coder-0.5b-instruct"


def test_the_alias_hint_unless_the_server_has_one(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    folder = str(model_folder(tmp_path))
    assert main(["--model", folder], {}) == 0
    assert "--model-alias 'claude-*=Tiny-Model'" in capsys.readouterr().err
    assert main(["--model", folder, "--model-alias", "claude-*=Tiny-Model"], {}) == 0
    assert "--model-alias" not in capsys.readouterr().err


def test_write_merges_into_the_settings_file_and_again_changes_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    folder = str(model_folder(tmp_path))
    home = tmp_path / "claude-home"
    home.mkdir()
    target = home / "settings.json"
    target.write_text(json.dumps(EXISTING, indent=4))
    environ = {"CLAUDE_CONFIG_DIR": str(home)}
    assert main(["--model", folder, "--write"], environ) == 0
    assert str(target) in capsys.readouterr().err
    merged = json.loads(target.read_text())
    assert merged["permissions"] == EXISTING["permissions"]
    assert merged["theme"] == "dark"
    assert list(merged) == ["permissions", "env", "theme"]  # order kept
    assert merged["env"]["EDITOR"] == "vim"
    assert merged["env"]["ANTHROPIC_MODEL"] == "Tiny-Model"
    assert merged["env"]["API_TIMEOUT_MS"] == str(30 * 60 * 1000)
    assert merged["env"] == {"EDITOR": "vim", **printed(capsys, "--model", folder)}
    first = target.read_text()
    assert main(["--model", folder, "--write"], environ) == 0
    assert target.read_text() == first
    assert stat.S_IMODE(target.stat().st_mode) == 0o600  # it may hold the key
    assert sorted(p.name for p in home.iterdir()) == ["settings.json"]


def test_write_creates_the_file_under_home_without_claude_config_dir(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HOME", str(tmp_path))
    argv = ["--model", str(model_folder(tmp_path)), "--write"]
    assert main(argv, {}) == 0
    written = json.loads((tmp_path / ".claude" / "settings.json").read_text())
    assert written == {"env": printed(capsys, *argv[:2])}


@pytest.mark.parametrize(
    ("text", "complaint"),
    [
        ('{"env": {"A": "1"},', "not valid JSON"),
        ("[1, 2]", "not a JSON object"),
        ('{"env": "A=1"}', "`env` is not an object"),
    ],
)
def test_a_settings_file_it_cannot_merge_is_left_alone(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], text: str, complaint: str
) -> None:
    target = tmp_path / "settings.json"
    target.write_text(text)
    argv = ["--model", str(model_folder(tmp_path)), "--write"]
    assert main(argv, {"CLAUDE_CONFIG_DIR": str(tmp_path)}) == 2
    err = capsys.readouterr().err
    assert "mlxcel claude-config: error:" in err
    assert complaint in err
    assert target.read_text() == text


def test_mlxcel_claude_config_is_a_command(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert mlxcel_main(["claude-config", "--model", str(model_folder(tmp_path))]) == 0
    assert json.loads(capsys.readouterr().out)["env"]["ANTHROPIC_MODEL"] == "Tiny-Model"
    assert mlxcel_main(["--help"]) == 0
    assert "claude-config" in capsys.readouterr().out
