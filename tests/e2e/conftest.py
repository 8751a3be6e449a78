"""The real server, as users start it, on the real default model."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from claude_code_cli import claude_executable
from codex_cli import codex_executable
from server_process import RealServer, start_server


@pytest.fixture(scope="session")
def real_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RealServer]:
    """The default model with 16 generation slots."""
    yield from start_server(
        tmp_path_factory.mktemp("server"), "--parallel", "16", "--max-queue-depth", "32"
    )


@pytest.fixture(scope="session")
def one_slot_server(
    tmp_path_factory: pytest.TempPathFactory, real_server: RealServer
) -> Iterator[RealServer]:
    """The default model with one slot and no waiting queue."""
    yield from start_server(
        tmp_path_factory.mktemp("server"), "--parallel", "1", "--max-queue-depth", "0"
    )


@pytest.fixture(scope="session")
def lenient_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RealServer]:
    """The default model as a Codex-style client needs it: hosted tools ignored."""
    yield from start_server(
        tmp_path_factory.mktemp("server"), "--parallel", "2", "--hosted-tools", "ignore"
    )


@pytest.fixture(scope="session")
def progress_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RealServer]:
    """The default model with one slot and a progress event every quiet second."""
    yield from start_server(
        tmp_path_factory.mktemp("server"), "--parallel", "1", "--sse-keepalive-secs", "1"
    )


@pytest.fixture(scope="session")
def codex() -> Path:
    """The pinned Codex CLI, installed from the npm registry the first time."""
    return codex_executable()


@pytest.fixture(scope="session")
def claude() -> Path:
    """The pinned Claude Code CLI, installed from the npm registry the first time."""
    return claude_executable()
