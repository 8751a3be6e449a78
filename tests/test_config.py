"""The per-user cache folder (`config.cache_dir`): where models and native builds go."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from mlxcel.config import cache_dir


def test_mlxcel_cache_dir_moves_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    monkeypatch.setenv("MLXCEL_CACHE_DIR", str(tmp_path / "mine"))
    assert cache_dir() == tmp_path / "mine"


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="XDG is the Linux convention")
def test_otherwise_the_xdg_cache_folder_is_honoured(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("MLXCEL_CACHE_DIR", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert cache_dir() == tmp_path / "mlxcel"
    monkeypatch.delenv("XDG_CACHE_HOME")
    assert cache_dir() == Path.home() / ".cache" / "mlxcel"
