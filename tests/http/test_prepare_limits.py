"""Request preparation: early size limits, linear costs, and no freezing of the event
loop (fake engine over real HTTP; its codec's render is wrapped to watch and hold it)."""

from __future__ import annotations

import functools
import hashlib
import json
import threading
import types
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import httpx
import pytest
import trio

import mlxcel.store.echo
from mlxcel.app import serve
from mlxcel.config import Settings
from mlxcel.generation import ModelNames
from mlxcel.model.fake import FakeCodec, FakeEngine, fake_factory

from support import FakeServer, post, wait_until

CONTEXT = 4096
# The server's early limits: characters and items per token of the context window.
CHARS_PER_TOKEN = 32
ITEMS_PER_TOKEN = 2


async def start(nursery: trio.Nursery, context_length: int = CONTEXT) -> FakeServer:
    engine = FakeEngine(step_delay=0.002)
    config = Settings(port=0)
    factory = functools.partial(fake_factory, engine, context_length)
    urls = await nursery.start(serve, config, factory, ModelNames("fake-model", "/models/fake"))
    return FakeServer(urls[0], engine, config)


@dataclass
class Gate:
    """Counts renders, notes any on the event loop's thread, and can hold the others."""

    renders: int = 0
    on_loop: int = 0
    entered: threading.Event = field(default_factory=threading.Event)
    release: threading.Event = field(default_factory=threading.Event)
    lock: threading.Lock = field(default_factory=threading.Lock)


def _on_trio_thread() -> bool:
    try:
        trio.lowlevel.current_trio_token()
    except RuntimeError:
        return False
    return True


@pytest.fixture
def gate(monkeypatch: pytest.MonkeyPatch) -> Iterator[Gate]:
    gate = Gate()
    gate.release.set()  # tests that hold renders clear it
    original = FakeCodec.render

    def render(self: FakeCodec, *args: Any, **kwargs: Any) -> list[int]:
        with gate.lock:
            gate.renders += 1
            gate.on_loop += _on_trio_thread()
        if not _on_trio_thread():  # never block the loop itself: that would hang the test
            gate.entered.set()
            gate.release.wait(timeout=30)
        return original(self, *args, **kwargs)

    monkeypatch.setattr(FakeCodec, "render", render)
    yield gate
    gate.release.set()


async def health_while_held(server: FakeServer, gate: Gate, path: str, body: Any) -> int:
    """Sends `body` with its renders held; `/health` must answer while it is prepared.

    Returns the held request's status once released."""
    gate.release.clear()
    status: list[int] = []

    async def heavy() -> None:
        status.append((await post(server, path, body)).status_code)

    try:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(heavy)
            with trio.fail_after(10):  # hang guard: preparation reaches its render
                await wait_until(gate.entered.is_set)
            with trio.fail_after(2):  # hang guard: the loop is free meanwhile
                async with httpx.AsyncClient(base_url=server.url) as http:
                    assert (await http.get("/health")).status_code == 200
            gate.release.set()
    finally:
        gate.release.set()
    assert gate.on_loop == 0
    return status[0]


def turns(count: int, words: str = "word") -> list[dict[str, Any]]:
    """`count` user/assistant exchanges, then a last user message."""
    items: list[dict[str, Any]] = []
    for n in range(count):
        items.append({"role": "user", "content": f"q{n}"})
        items.append({"role": "assistant", "content": words})
    items.append({"role": "user", "content": "echo: done"})
    return items


# --- the reasoning-echo keys ---------------------------------------------------------


async def test_echo_keys_hash_each_item_once(
    nursery: trio.Nursery, monkeypatch: pytest.MonkeyPatch
) -> None:
    hashed = [0]

    class Counted:
        def __init__(self, inner: Any) -> None:
            self._inner = inner

        def update(self, data: bytes) -> None:
            hashed[0] += len(data)
            self._inner.update(data)

        def copy(self) -> Counted:
            return Counted(self._inner.copy())

        def hexdigest(self) -> str:
            return str(self._inner.hexdigest())

    counting = types.SimpleNamespace(sha256=lambda data=b"": Counted(hashlib.sha256(data)))
    monkeypatch.setattr(mlxcel.store.echo, "hashlib", counting)
    server = await start(nursery, context_length=100_000)
    body = {"model": "fake-model", "input": turns(400)}
    r = await post(server, "/v1/responses", body)
    assert r.status_code == 200, r.text
    # Restoring, remembering and the new turn's key each hash the input about once
    # (hashing each turn's whole prefix would be some 200 times the input).
    assert 0 < hashed[0] < 4 * len(json.dumps(body))


async def test_health_answers_while_a_long_resent_history_is_prepared(
    nursery: trio.Nursery, gate: Gate
) -> None:
    server = await start(nursery, context_length=1_000_000)
    body = {"model": "fake-model", "input": turns(3000)}
    assert await health_while_held(server, gate, "/v1/responses", body) == 200


# --- compaction ----------------------------------------------------------------------


async def test_compaction_renders_a_constant_number_of_times(
    nursery: trio.Nursery, gate: Gate
) -> None:
    server = await start(nursery, context_length=200_000)
    # Every turn fits in `keep_tokens` but the first (long) one, summarised as the least.
    first = [{"role": "user", "content": "long " * 500}, {"role": "assistant", "content": "ok"}]
    body = {
        "model": "fake-model",
        "input": first + turns(2000, "an answer"),
        "keep_tokens": 100_000,
    }
    r = await post(server, "/v1/responses/compact", body)
    assert r.status_code == 200, r.text
    output = r.json()["output"]
    assert (len(output), output[-1]["type"]) == (4001 + 1, "compaction")
    # Before and after, the summary prompt and the split's estimate: not one per cut.
    assert gate.renders <= 6


async def test_keep_tokens_beyond_the_context_window_is_400(
    nursery: trio.Nursery, gate: Gate
) -> None:
    server = await start(nursery)
    body = {"model": "fake-model", "input": turns(20), "keep_tokens": 1_000_000_000}
    r = await post(server, "/v1/responses/compact", body)
    assert r.status_code == 400, r.text
    assert (r.json()["error"]["param"], r.json()["error"]["code"]) == (
        "keep_tokens",
        "invalid_value",
    )
    assert gate.renders == 0


# --- early limits and the event loop -------------------------------------------------

ENDPOINTS = ["/v1/responses", "/v1/responses/input_tokens", "/v1/responses/compact"]


@pytest.mark.parametrize("path", ENDPOINTS)
@pytest.mark.parametrize(
    "raw_input",
    [
        "echo: " + "x" * (CHARS_PER_TOKEN * CONTEXT),
        [{"role": "user", "content": "x"}] * (ITEMS_PER_TOKEN * CONTEXT + 1),
        [{"role": "user", "content": "x" * 1024}] * (CHARS_PER_TOKEN * CONTEXT // 1024 + 1),
    ],
    ids=["characters", "items", "characters-in-items"],
)
async def test_inputs_that_cannot_fit_are_400_before_any_render(
    nursery: trio.Nursery, gate: Gate, path: str, raw_input: Any
) -> None:
    server = await start(nursery)
    r = await post(server, path, {"model": "fake-model", "input": raw_input})
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["type"] == "invalid_request_error"
    assert (error["param"], error["code"]) == ("input", "context_length_exceeded")
    assert gate.renders == 0


@pytest.mark.parametrize(
    ("path", "status"), [(ENDPOINTS[0], 400), (ENDPOINTS[1], 200), (ENDPOINTS[2], 400)]
)
async def test_health_answers_while_a_large_input_is_prepared(
    nursery: trio.Nursery, gate: Gate, path: str, status: int
) -> None:
    server = await start(nursery)
    # Within the early limits, so it is rendered (and then found too long to generate).
    body = {"model": "fake-model", "input": turns(4, "x" * 30_000)}
    assert await health_while_held(server, gate, path, body) == status


@pytest.mark.parametrize("path", ENDPOINTS)
async def test_too_many_items_or_parts_are_400_before_validation(
    nursery: trio.Nursery, path: str
) -> None:
    # Validating a million items would hold the event loop for seconds.
    server = await start(nursery, context_length=1_000_000)
    parts = [{"type": "input_text", "text": "x"}] * 50_000
    for raw_input in (
        [{"role": "user", "content": "x"}] * 100_001,
        [{"role": "user", "content": parts}, {"role": "user", "content": parts}],
    ):
        r = await post(server, path, {"model": "fake-model", "input": raw_input})
        assert r.status_code == 400, r.text
        error = r.json()["error"]
        assert (error["param"], error["code"]) == ("input", "array_above_max_length")
