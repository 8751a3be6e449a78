"""`--prompt-cache-dir` and `--prompt-cache-disk-bytes`: where the disk tier goes, and
what happens when it cannot go there."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from mlxcel.cli.flags import build_parser, settings_from_args
from mlxcel.cli.prompt_cache import FOLDER, resolve_prompt_cache_dir
from mlxcel.config import Settings
from mlxcel.errors import ConfigError


def settings(argv: list[str], env: dict[str, str] | None = None) -> Settings:
    return settings_from_args(build_parser("t", env or {}).parse_args(argv))


def test_the_flags_and_their_variables() -> None:
    given = settings(["--prompt-cache-dir", "/x/y", "--prompt-cache-disk-bytes", "123"])
    assert (given.prompt_cache_dir, given.prompt_cache_disk_bytes) == (Path("/x/y"), 123)
    env = {"MLXCEL_PROMPT_CACHE_DIR": "/a", "MLXCEL_PROMPT_CACHE_DISK_BYTES": "7"}
    from_env = settings([], env)
    assert (from_env.prompt_cache_dir, from_env.prompt_cache_disk_bytes) == (Path("/a"), 7)
    assert settings([]).prompt_cache_dir is None
    with pytest.raises(ConfigError, match="prompt-cache-disk-bytes"):
        settings(["--prompt-cache-disk-bytes", "-1"])
    assert "--prompt-cache-dir" in build_parser("t", {}).format_help()


def test_on_by_default_with_sqlite_off_with_memory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("MLXCEL_CACHE_DIR", str(tmp_path / "user-cache"))
    sqlite = resolve_prompt_cache_dir(settings(["--store", f"sqlite:{tmp_path / 's.db'}"]))
    assert sqlite.prompt_cache_dir == tmp_path / "user-cache" / FOLDER
    assert sqlite.prompt_cache_dir.is_dir()
    assert resolve_prompt_cache_dir(settings([])).prompt_cache_dir is None
    given = resolve_prompt_cache_dir(settings(["--prompt-cache-dir", str(tmp_path / "mine")]))
    assert given.prompt_cache_dir == tmp_path / "mine"  # with a memory store too
    off = ["--store", "sqlite", "--prompt-cache-disk-bytes", "0"]
    assert resolve_prompt_cache_dir(settings(off)).prompt_cache_dir is None
    no_cache = ["--prompt-cache-dir", str(tmp_path / "x"), "--prompt-cache-bytes", "0"]
    assert resolve_prompt_cache_dir(settings(no_cache)).prompt_cache_dir is None


def test_a_folder_given_that_cannot_be_written_stops_the_start(tmp_path: Path) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    with pytest.raises(ConfigError, match=r"--prompt-cache-dir .*cannot write"):
        resolve_prompt_cache_dir(settings(["--prompt-cache-dir", str(blocker / "cache")]))


def test_a_default_folder_that_cannot_be_written_turns_the_tier_off(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    monkeypatch.setenv("MLXCEL_CACHE_DIR", str(blocker))
    with caplog.at_level(logging.WARNING, "mlxcel.cli.prompt_cache"):
        resolved = resolve_prompt_cache_dir(settings(["--store", f"sqlite:{tmp_path / 's'}"]))
    assert resolved.prompt_cache_dir is None
    assert "memory only" in caplog.text
