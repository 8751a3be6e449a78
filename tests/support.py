"""Helpers shared by tests (fixtures live in conftest.py)."""

from __future__ import annotations

import functools
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import trio
from mlxcel.config import Settings
from mlxcel.model.fake import FakeEngine
from openai import OpenAI


@dataclass
class FakeServer:
    url: str
    engine: FakeEngine
    settings: Settings
    _clients: list[OpenAI] = field(default_factory=list)

    def client(self, **kwargs: Any) -> OpenAI:
        """An SDK client for this server, closed when the test ends."""
        client = OpenAI(base_url=f"{self.url}/v1", api_key="sk-no-auth", max_retries=0, **kwargs)
        self._clients.append(client)
        return client

    def close(self) -> None:
        for client in self._clients:
            client.close()


StartServer = Callable[..., Awaitable[FakeServer]]


async def in_thread(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """Run a blocking SDK call off the Trio thread (the server runs on it)."""
    return await trio.to_thread.run_sync(functools.partial(fn, *args, **kwargs))


async def wait_until(predicate: Callable[[], bool]) -> None:
    """Poll state another thread owns (the model thread's engine) until it holds.

    Callers bound the wait with `trio.fail_after`."""
    while not predicate():  # noqa: ASYNC110 - the state is not ours to signal
        await trio.sleep(0.01)
