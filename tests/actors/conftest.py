"""Fixtures of the actor tests."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from unittest import mock

import pytest

from mlxcel.model.tool_parsers import PARSERS

from builder_stream import Script, ScriptedParser
from redis_server import RedisServer


@pytest.fixture
def script() -> Iterator[Script]:
    """The batches the `scripted` tool-call format's parser reports (fill it in)."""
    batches: Script = []
    with mock.patch.dict(PARSERS, {"scripted": lambda names, schemas: ScriptedParser(batches)}):
        yield batches


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """A store test runs on every backend; on Redis only when it keeps to real time.

    Trio's autojump clock jumps whenever every task waits, real network I/O to Redis
    included, and the store's lease timer then fires at moments no test controls: a test
    on the autojump clock runs on memory and SQLite alone (not collected for Redis, never
    skipped)."""
    if "store_spec" in metafunc.fixturenames:
        kinds = ["memory", "sqlite"]
        if "autojump_clock" not in metafunc.fixturenames:
            kinds.append("redis")
        metafunc.parametrize("store_spec", kinds, indirect=True)


@pytest.fixture
def store_spec(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """The `--store` of a store test (see `pytest_generate_tests`); with Redis, the test
    passes a key prefix of its own too."""
    kind = str(request.param)
    if kind == "redis":
        server: RedisServer = request.getfixturevalue("redis_server")
        return server.url
    return "memory" if kind == "memory" else f"sqlite:{tmp_path / 'store.sqlite3'}"
