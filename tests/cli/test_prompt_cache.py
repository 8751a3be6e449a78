"""`--prompt-cache-dir` and `--prompt-cache-disk-bytes`: where the disk tier goes, and
what happens when it cannot go there."""

from __future__ import annotations

import logging
import os
import stat
from collections.abc import Iterator
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


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


@pytest.fixture
def umask_022() -> Iterator[None]:
    old = os.umask(0o022)
    yield
    os.umask(old)


@pytest.mark.usefixtures("umask_022")
def test_every_models_folder_and_file_is_closed_at_start(tmp_path: Path) -> None:
    """The files hold prompts' token ids: those an earlier release left readable by others
    (0644 in 0755 folders) are the owner's alone once the server starts, for every model's
    folder (each named by its 16-digit key), loaded or not."""
    root = tmp_path / "mine"
    first, second, other = root / "0123456789abcdef", root / "fedcba9876543210", root / "notes"
    files = [first / "a.safetensors", second / ".b.safetensors.7.part"]
    for folder in (first, second, other):
        folder.mkdir(parents=True)
    for path in [*files, other / "kept.txt"]:
        path.write_bytes(b"tokens")
        os.chmod(path, 0o644)
    for folder in (root, first, second, other):
        os.chmod(folder, 0o755)
    resolved = resolve_prompt_cache_dir(settings(["--prompt-cache-dir", str(root)]))
    assert resolved.prompt_cache_dir == root
    assert [mode(f) for f in (root, first, second)] == [0o700] * 3
    assert [mode(f) for f in files] == [0o600] * 2
    assert (mode(other), mode(other / "kept.txt")) == (0o755, 0o644)  # not the tier's


@pytest.mark.usefixtures("umask_022")
def test_new_folders_are_0700_and_a_shared_one_keeps_its_mode(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("MLXCEL_CACHE_DIR", str(tmp_path / "user-cache"))
    default = resolve_prompt_cache_dir(settings(["--store", f"sqlite:{tmp_path / 's.db'}"]))
    assert default.prompt_cache_dir is not None
    assert mode(default.prompt_cache_dir) == 0o700
    deep = tmp_path / "a" / "b" / "cache"
    resolve_prompt_cache_dir(settings(["--prompt-cache-dir", str(deep)]))
    assert mode(deep) == 0o700
    shared = tmp_path / "shared"  # a folder every user writes to, as /tmp is
    shared.mkdir()
    os.chmod(shared, 0o1777)
    (shared / "0123456789abcdef").mkdir(mode=0o755)
    resolve_prompt_cache_dir(settings(["--prompt-cache-dir", str(shared)]))
    assert stat.S_IMODE(shared.stat().st_mode) == 0o1777
    assert mode(shared / "0123456789abcdef") == 0o700  # the tier's own folder in it is closed
