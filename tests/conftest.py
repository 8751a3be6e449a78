"""Shared fixtures: an in-process server on the fake engine, real Redis servers, the store
kinds a store test runs on, the scripted tool-call parser and the default model's tokenizer;
and the `slow` mark of every test that needs more than this process (see
`pytest_collection_modifyitems`)."""

from __future__ import annotations

import functools
import time
import uuid
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any
from unittest import mock

import httpx
import pytest
import trio

from mlxcel.app import serve
from mlxcel.config import Settings
from mlxcel.generation import ModelNames
from mlxcel.model.fake import FakeEngine, fake_factory
from mlxcel.respond.tool_parsers import PARSERS

from builder_stream import Script, ScriptedParser
from redis_server import RedisServer
from server_process import ServerProcesses
from support import FakeServer, KeysFile, StartServer, key_prefix

TESTS = Path(__file__).resolve().parent

SLOW_FOLDERS = frozenset({"e2e", "cluster"})
"""Folders of tests on the real model, the Codex CLI, or replicas in their own processes."""
SLOW_FIXTURES = frozenset(
    {
        "redis_server",  # a redis-server process
        "own_redis",
        "redis_store",
        "servers",  # server processes (`server_process.py`)
        "tokenizer",  # the default model's files
        "tls_redis",  # openssl and a redis-server process
    }
)
SLOW_MARKS = frozenset({"e2e", "mlx"})
"""Real model weights: the default model, or the tiny one run on MLX."""
SLOW_PARAMS = ("store_spec", "fake_store")
"""Store parameters whose `redis` case starts on the session's redis-server."""


def _is_slow(item: pytest.Item) -> bool:
    """Whether `item` needs model weights, Redis, HAProxy, openssl, npm or server
    processes: by its folder, its fixtures, its marks or its store parameter."""
    if item.path.resolve().relative_to(TESTS).parts[0] in SLOW_FOLDERS:
        return True
    if SLOW_FIXTURES & set(getattr(item, "fixturenames", ())):
        return True
    if any(item.get_closest_marker(name) for name in SLOW_MARKS):
        return True
    params = getattr(getattr(item, "callspec", None), "params", {})
    return any(params.get(name) == "redis" for name in SLOW_PARAMS)


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Mark `slow` every test that needs more than this process, so that
    `pytest -m "not slow"` runs the unit and in-process (fake engine) tests alone; tests
    that start such things in their own body carry the mark themselves."""
    for item in items:
        if _is_slow(item):
            item.add_marker(pytest.mark.slow)
        if item.path.resolve().relative_to(TESTS).parts[0] == "e2e":
            # One test process runs every real-model test, so the session's real servers
            # start once and two of them never share the cores with each other.
            item.add_marker(pytest.mark.xdist_group("real-model"))


@pytest.fixture
def fake_store() -> str:
    """The store kind (`memory`, `sqlite` or `redis`) of the fake servers a test starts;
    the store-facing test modules override it to run on each. Each SQLite server gets its
    own file (one server per file); each Redis one its own key prefix on the session's
    Redis."""
    return "memory"


@pytest.fixture
def start_fake_server(
    nursery: trio.Nursery,
    fake_store: str,
    tmp_path_factory: pytest.TempPathFactory,
    request: pytest.FixtureRequest,
) -> Iterator[StartServer]:
    """Starts an in-process server (fake engine) in the test's nursery; stops with it."""
    servers: list[FakeServer] = []

    async def start(
        engine: FakeEngine | None = None,
        *,
        opens_reasoning: bool = False,
        context_length: int = 4096,
        **settings: Any,
    ) -> FakeServer:
        engine = engine or FakeEngine(step_delay=0.002)
        if fake_store == "sqlite":
            path = tmp_path_factory.mktemp("store") / "store.sqlite3"
            base = Settings(port=0, store=f"sqlite:{path}")
        elif fake_store == "redis":
            redis: RedisServer = request.getfixturevalue("redis_server")
            base = Settings(port=0, store=redis.url, redis_key_prefix=key_prefix())
        else:
            base = Settings(port=0, store=fake_store)
        config = replace(base, **settings)
        factory = functools.partial(
            fake_factory, engine, context_length, opens_reasoning=opens_reasoning
        )
        names = ModelNames("fake-model", "/models/fake")
        urls = await nursery.start(serve, config, factory, names)
        servers.append(FakeServer(urls[0], engine, config))
        await _until_ready(urls[0])
        return servers[-1]

    yield start
    for server in servers:
        server.close()


async def _until_ready(url: str, patience: float = 30) -> None:
    """Wait until the model has loaded (`/health` 200), as a client polling it would: the
    server listens before its model thread is done, and on a loaded machine a test's
    first request could otherwise meet "the model is still loading". Timed on the wall
    clock: a test's mock clock may be frozen."""
    deadline = time.monotonic() + patience
    async with httpx.AsyncClient(base_url=url, timeout=patience) as http:
        while (await http.get("/health")).status_code != 200 and time.monotonic() < deadline:
            await trio.lowlevel.checkpoint()  # each poll is a real request: no busy spin


@pytest.fixture
def servers(tmp_path: Path) -> Iterator[ServerProcesses]:
    """Server processes on the fake engine a test starts (`tests/helpers/server_process.py`),
    killed at its end whatever happened."""
    started = ServerProcesses(tmp_path)
    try:
        yield started
    finally:
        started.close()


@pytest.fixture
async def fake_server(start_fake_server: StartServer) -> FakeServer:
    return await start_fake_server()


@pytest.fixture(scope="session")
def redis_server() -> Iterator[RedisServer]:
    """One real `redis-server` for the whole session; tests keep apart by `redis_prefix`.
    Tests that stop, kill or pause Redis take `own_redis` instead."""
    server = RedisServer()
    try:
        yield server
    finally:
        server.close()


@pytest.fixture
def redis_prefix() -> str:
    """A key prefix of this test's own (`--redis-key-prefix`, `MLXCEL_REDIS_KEY_PREFIX`)."""
    return f"t-{uuid.uuid4().hex[:8]}"


@pytest.fixture
def redis_store(redis_server: RedisServer) -> str:
    """The `--store` value for the session's Redis (pass `redis_prefix` alongside)."""
    return redis_server.url


@pytest.fixture
def own_redis() -> Iterator[RedisServer]:
    """A private `redis-server` for this test, free to stop, kill or pause; closed after."""
    server = RedisServer()
    try:
        yield server
    finally:
        server.close()


@pytest.fixture
def keys_file(tmp_path: Path) -> KeysFile:
    """Writes this test's keys file (`--api-key-file`), again on each call (a rotation),
    and returns its path."""
    path = tmp_path / "keys"

    def write(text: str) -> Path:
        path.write_text(text)
        return path

    return write


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


@pytest.fixture(scope="session")
def tokenizer() -> Any:
    """The default model's real tokenizer (the test command fetches the model first)."""
    from tokenizers import Tokenizer

    from mlxcel.model.provision.fetch import default_model_dir, is_ready

    path = default_model_dir()
    assert is_ready(path), "the default model is missing: run `mlxcel fetch-model` first"
    return Tokenizer.from_file(str(Path(path) / "tokenizer.json"))
