"""Shared fixtures: an in-process server on the fake engine, and real Redis servers."""

from __future__ import annotations

import functools
import time
import uuid
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import httpx
import pytest
import trio

from mlxcel.app import serve
from mlxcel.config import Settings
from mlxcel.model.fake import FakeEngine, fake_factory
from mlxcel.prepare.intake import ModelNames

from redis_server import RedisServer
from server_process import ServerProcesses
from support import FakeServer, StartServer, key_prefix


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
    """Server processes on the fake engine a test starts (`tests/server_process.py`),
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
