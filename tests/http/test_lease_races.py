"""An unload or an eviction racing requests still being prepared, over real HTTP on fake
engines: every route holds its model by one lease from the start of its preparation to
the end of its work, so the unload waits for them and they are served, and nothing waits
on anything that waits on it. A deadlock fails within the test's time bound instead of
hanging; afterwards `/health` answers, an ordinary request completes and the unload has
finished.

Requests are held in preparation by wrapping the routes' preparation calls with a gate
(the server runs in this process, on this Trio run)."""

from __future__ import annotations

import functools
import time
from collections.abc import Awaitable, Callable
from typing import Any

import httpx
import openai
import pytest
import trio

from mlxcel.app import serve
from mlxcel.config import Settings
from mlxcel.fleet import ConfiguredModel
from mlxcel.generation import ModelNames
from mlxcel.http import chat, messages, responses
from mlxcel.model.fake import FakeEngine, fake_factory

from support import in_thread

REQUESTS = 16
BOUND_SECS = 15
"""Long enough for 16 short replies on the fake engine many times over; a deadlock
(the requests and the unload waiting on each other for ever) fails here."""


class Gate:
    """Holds every preparation that enters it until `open`; counts those waiting."""

    def __init__(self) -> None:
        self.opened = trio.Event()
        self.waiting = 0
        self.arrived = trio.Event()

    def wrap(self, prepare: Callable[..., Awaitable[Any]]) -> Callable[..., Awaitable[Any]]:
        async def held(*args: Any, **kwargs: Any) -> Any:
            self.waiting += 1
            if self.waiting == REQUESTS:
                self.arrived.set()
            await self.opened.wait()
            return await prepare(*args, **kwargs)

        return held


@pytest.fixture
def gate(monkeypatch: pytest.MonkeyPatch) -> Gate:
    held = Gate()
    monkeypatch.setattr(responses, "prepare_response", held.wrap(responses.prepare_response))
    monkeypatch.setattr(chat, "prepare_chat", held.wrap(chat.prepare_chat))
    monkeypatch.setattr(messages, "prepare_chat", held.wrap(messages.prepare_chat))
    return held


async def start(nursery: trio.Nursery, **settings: Any) -> str:
    """A server with fake models `a` (the default, loaded at start) and `b`."""
    engines = {n: FakeEngine(step_delay=0.002) for n in ("a", "b")}
    names = {n: ModelNames(n, f"/models/{n}") for n in ("a", "b")}
    more = [ConfiguredModel(names["b"], functools.partial(fake_factory, engines["b"]))]
    run = functools.partial(serve, more=more)
    config = Settings(port=0, **settings)
    urls = await nursery.start(
        run, config, functools.partial(fake_factory, engines["a"]), names["a"]
    )
    await healthy(urls[0])
    return str(urls[0])


async def healthy(url: str) -> dict[str, Any]:
    async with httpx.AsyncClient(base_url=url, timeout=30) as http:
        with trio.fail_after(30):
            while (r := await http.get("/health")).status_code != 200:  # noqa: ASYNC110
                await trio.sleep(0.01)
    body: dict[str, Any] = r.json()
    return body


def client(url: str) -> openai.OpenAI:
    return openai.OpenAI(
        base_url=f"{url}/v1", api_key="sk-none", max_retries=0, timeout=BOUND_SECS + 5
    )


def _response(url: str, model: str, word: str) -> str:
    with client(url) as sdk:
        return sdk.responses.create(model=model, input=f"echo: {word}").output_text


def _streamed(url: str, model: str, word: str) -> str:
    with client(url) as sdk:
        events = list(sdk.responses.create(model=model, input=f"echo: {word}", stream=True))
    assert events[-1].type == "response.completed"
    return str(events[-1].response.output_text)


def _chat(url: str, model: str, word: str) -> str:
    with client(url) as sdk:
        messages = [{"role": "user", "content": f"echo: {word}"}]
        done = sdk.chat.completions.create(model=model, messages=messages, n=2)  # type: ignore[arg-type]
    texts = {c.message.content for c in done.choices}
    assert len(done.choices) == 2
    return texts.pop() or ""


def _chat_streamed(url: str, model: str, word: str) -> str:
    with client(url) as sdk:
        messages = [{"role": "user", "content": f"echo: {word}"}]
        chunks = list(
            sdk.chat.completions.create(model=model, messages=messages, stream=True, n=2)  # type: ignore[arg-type]
        )
    return "".join(
        c.choices[0].delta.content or "" for c in chunks if c.choices and not c.choices[0].index
    )


def _message(url: str, model: str, word: str) -> str:
    body = {
        "model": model,
        "max_tokens": 16,
        "messages": [{"role": "user", "content": f"echo: {word}"}],
    }
    r = httpx.post(f"{url}/v1/messages", json=body, timeout=BOUND_SECS + 5)
    assert r.status_code == 200, r.text
    return str(r.json()["content"][0]["text"])


def _background(url: str, model: str, word: str) -> str:
    with client(url) as sdk:
        job = sdk.responses.create(model=model, input=f"echo: {word}", background=True)
        deadline = time.monotonic() + BOUND_SECS
        while job.status in ("queued", "in_progress") and time.monotonic() < deadline:
            time.sleep(0.02)
            job = sdk.responses.retrieve(job.id)
    assert job.status == "completed", job
    return job.output_text


KINDS = (_response, _streamed, _chat, _chat_streamed, _message, _background)


async def ask_all(url: str, model: str, answers: dict[int, str]) -> None:
    async with trio.open_nursery() as asking:
        for i in range(REQUESTS):
            kind = KINDS[i % len(KINDS)]

            async def one(i: int = i, kind: Callable[[str, str, str], str] = kind) -> None:
                answers[i] = await in_thread(kind, url, model, f"w{i}")

            asking.start_soon(one)


async def until_state(url: str, model: str, state: str) -> None:
    async with httpx.AsyncClient(base_url=url, timeout=30) as http:
        while (await http.get(f"/v1/models/{model}")).json()["state"] != state:  # noqa: ASYNC110
            await trio.sleep(0.005)


async def an_ordinary_request_completes(url: str, model: str) -> None:
    assert (await healthy(url))["status"] == "ok"
    assert await in_thread(_response, url, model, "after") == "after"


@pytest.mark.parametrize("racer", ["unload", "eviction"])
async def test_an_unload_racing_requests_in_preparation(
    nursery: trio.Nursery, gate: Gate, racer: str
) -> None:
    url = await start(nursery)
    answers: dict[int, str] = {}
    other: list[str] = []
    async with httpx.AsyncClient(base_url=url, timeout=BOUND_SECS + 5) as http:

        async def unload() -> None:
            r = await http.post("/v1/models/a/unload")
            assert r.status_code == 200, r.text
            other.append(r.json()["state"])

        async def ask_b() -> None:  # `b` at a limit of one: `a` is evicted to make room
            other.append(await in_thread(_response, url, "b", "from b"))

        with trio.fail_after(BOUND_SECS):
            async with trio.open_nursery() as racing:
                racing.start_soon(ask_all, url, "a", answers)
                await gate.arrived.wait()  # every request holds `a` while it is prepared
                racing.start_soon(unload if racer == "unload" else ask_b)
                await until_state(url, "a", "unloading")
                gate.opened.set()
    assert answers == {i: f"w{i}" for i in range(REQUESTS)}
    assert other == ["unloaded" if racer == "unload" else "from b"]
    states = {"a": (await healthy(url))["models"]["a"]}
    assert states == {"a": "unloaded"}
    await an_ordinary_request_completes(url, "a")
