"""Shared fixtures: an in-process server on the fake engine."""

from __future__ import annotations

import functools
from collections.abc import Iterator
from dataclasses import replace
from typing import Any

import pytest
import trio

from mlxcel.app import serve
from mlxcel.config import Settings
from mlxcel.model.fake import FakeEngine, fake_factory
from mlxcel.prepare.intake import ModelNames

from support import FakeServer, StartServer


@pytest.fixture
def start_fake_server(nursery: trio.Nursery) -> Iterator[StartServer]:
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
        config = replace(Settings(port=0), **settings)
        factory = functools.partial(
            fake_factory, engine, context_length, opens_reasoning=opens_reasoning
        )
        names = ModelNames("fake-model", "/models/fake")
        urls = await nursery.start(serve, config, factory, names)
        servers.append(FakeServer(urls[0], engine, config))
        return servers[-1]

    yield start
    for server in servers:
        server.close()


@pytest.fixture
async def fake_server(start_fake_server: StartServer) -> FakeServer:
    return await start_fake_server()
