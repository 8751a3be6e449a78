"""`n` choices, penalties and `logit_bias` on Chat Completions and Completions over real
HTTP with the `openai` SDK (the fake engine scripts the replies: `echo: TEXT` answers
TEXT, one word per token), and their hostile clients."""

from __future__ import annotations

import time
from typing import Any

import httpx
import openai
import pytest
import trio

from mlxcel.http import chat
from mlxcel.http.chat_sampling import MAX_CHOICES, MAX_LOGIT_BIAS
from mlxcel.http.choices import metered_all
from mlxcel.model.fake import FakeEngine

from support import (
    FakeServer,
    StartServer,
    an_ordinary_request_completes,
    chat_body,
    in_thread,
    raw_request,
    read_until,
    wait_until,
)

ROUTES = ["/v1/chat/completions", "/v1/completions"]


async def test_n_choices_each_with_its_index_and_usage_summed(fake_server: FakeServer) -> None:
    client = fake_server.client()
    messages = [{"role": "user", "content": "echo: one two three"}]
    single = await in_thread(
        client.chat.completions.create, model="fake-model", messages=messages, seed=5
    )
    three = await in_thread(
        client.chat.completions.create, model="fake-model", messages=messages, n=3, seed=5
    )
    assert [c.index for c in three.choices] == [0, 1, 2]
    assert all(c.message.content == "one two three" for c in three.choices)
    assert all(c.finish_reason == "stop" for c in three.choices)
    assert three.usage.prompt_tokens == single.usage.prompt_tokens
    assert three.usage.completion_tokens == 3 * single.usage.completion_tokens
    assert three.usage.total_tokens == three.usage.prompt_tokens + three.usage.completion_tokens


async def test_n_choices_stream_interleaved_with_one_summed_usage(
    fake_server: FakeServer,
) -> None:
    client = fake_server.client()

    def run() -> list[Any]:
        return list(
            client.chat.completions.create(
                model="fake-model",
                messages=[{"role": "user", "content": "echo: a b c d"}],
                n=3,
                stream=True,
                stream_options={"include_usage": True},
            )
        )

    chunks = await in_thread(run)
    texts: dict[int, str] = {}
    finishes: dict[int, str] = {}
    assert len({c.id for c in chunks}) == 1
    for chunk in chunks[:-1]:
        for choice in chunk.choices:
            texts[choice.index] = texts.get(choice.index, "") + (choice.delta.content or "")
            if choice.finish_reason is not None:
                finishes[choice.index] = choice.finish_reason
    assert texts == {0: "a b c d", 1: "a b c d", 2: "a b c d"}
    assert finishes == {0: "stop", 1: "stop", 2: "stop"}
    usages = [c.usage for c in chunks if c.usage is not None]
    assert len(usages) == 1
    assert chunks[-1].usage is not None
    assert not chunks[-1].choices
    assert usages[0].completion_tokens == 3 * 4


async def test_legacy_completions_take_n_streaming_and_not(fake_server: FakeServer) -> None:
    client = fake_server.client()
    done = await in_thread(client.completions.create, model="fake-model", prompt="echo: x y", n=2)
    assert [(c.index, c.text) for c in done.choices] == [(0, "x y"), (1, "x y")]

    def run() -> list[Any]:
        return list(
            client.completions.create(model="fake-model", prompt="echo: x y", n=2, stream=True)
        )

    texts: dict[int, str] = {}
    for chunk in await in_thread(run):
        for choice in chunk.choices:
            texts[choice.index] = texts.get(choice.index, "") + choice.text
    assert texts == {0: "x y", 1: "x y"}


@pytest.mark.parametrize("path", ROUTES)
@pytest.mark.parametrize(
    ("change", "param"),
    [
        pytest.param({"n": MAX_CHOICES + 1}, "n", id="n-above-the-bound"),
        pytest.param({"n": 0}, "n", id="n-zero"),
        pytest.param({"frequency_penalty": 2.5}, "frequency_penalty", id="frequency"),
        pytest.param({"presence_penalty": -3}, "presence_penalty", id="presence"),
        pytest.param({"logit_bias": {"12": 101}}, "logit_bias", id="bias-value"),
        pytest.param({"logit_bias": {"twelve": 1}}, "logit_bias", id="bias-key"),
        pytest.param({"logit_bias": {"-3": 1}}, "logit_bias", id="bias-negative-id"),
        pytest.param({"logit_bias": {"²": 1}}, "logit_bias", id="bias-unicode-digit"),
        pytest.param({"logit_bias": {str(0x110000): 1}}, "logit_bias", id="bias-past-vocab"),
        pytest.param({"logit_bias": {"12": "high"}}, "logit_bias", id="bias-type"),
        pytest.param(
            {"logit_bias": {str(i): 1 for i in range(MAX_LOGIT_BIAS + 1)}},
            "logit_bias",
            id="bias-too-many",
        ),
    ],
)
async def test_bad_sampling_fields_are_openai_shaped_400s(
    fake_server: FakeServer, path: str, change: dict[str, Any], param: str
) -> None:
    async with httpx.AsyncClient(base_url=fake_server.url, timeout=30) as http:
        r = await http.post(path, json=chat_body(path, "hi") | change)
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert (error["param"] or "").startswith(param), error


@pytest.mark.parametrize("path", ROUTES)
async def test_penalties_and_a_bias_are_accepted_where_valid(
    fake_server: FakeServer, path: str
) -> None:
    extra = {"frequency_penalty": 2, "presence_penalty": -2, "logit_bias": {"65": -100}}
    async with httpx.AsyncClient(base_url=fake_server.url, timeout=30) as http:
        r = await http.post(path, json=chat_body(path, "echo: fine", **extra))
    assert r.status_code == 200, r.text


async def test_a_huge_logit_bias_is_refused_before_it_is_read_entry_by_entry(
    fake_server: FakeServer,
) -> None:
    huge = {str(i): 1 for i in range(300_000)}
    async with httpx.AsyncClient(base_url=fake_server.url, timeout=60) as http:
        started = time.monotonic()
        r = await http.post(
            "/v1/chat/completions", json=chat_body(ROUTES[0], "hi", logit_bias=huge)
        )
        took = time.monotonic() - started
    assert r.status_code == 400
    assert r.json()["error"]["param"] == "logit_bias"
    assert took < 10, took
    await an_ordinary_request_completes(fake_server)


@pytest.mark.parametrize("path", ROUTES)
async def test_n_needs_a_slot_for_each_choice(start_fake_server: StartServer, path: str) -> None:
    server = await start_fake_server(FakeEngine(step_delay=0.002), parallel=2, max_queue_depth=0)
    async with httpx.AsyncClient(base_url=server.url, timeout=30) as http:
        for stream in (False, True):
            r = await http.post(path, json=chat_body(path, "echo: a", n=3, stream=stream))
            assert r.status_code == 503, r.text
        ok = await http.post(path, json=chat_body(path, "echo: a", n=2))
        assert ok.status_code == 200
        assert len(ok.json()["choices"]) == 2
        health = (await http.get("/health")).json()
    assert health["slots"]["queued"] == 0
    await an_ordinary_request_completes(server)


@pytest.mark.parametrize("path", ROUTES)
async def test_hanging_up_mid_stream_with_n_4_frees_every_slot(
    start_fake_server: StartServer, path: str
) -> None:
    engine = FakeEngine()
    server = await start_fake_server(engine, parallel=4, max_queue_depth=0)
    engine.hold()
    stream = await raw_request(
        server.url, chat_body(path, "echo: w0 w1 w2 w3 w4 w5", n=4, stream=True), path=path
    )
    await read_until(stream, b'"index": 3')  # every choice has its slot and its first word
    await wait_until(lambda: engine.active == 4)
    await stream.aclose()
    await wait_until(lambda: engine.active == 0)
    engine.release()
    async with httpx.AsyncClient(base_url=server.url, timeout=30) as http:
        with trio.fail_after(10):
            r = await http.post(path, json=chat_body(path, "echo: again", n=4))
    assert r.status_code == 200, r.text
    assert len(r.json()["choices"]) == 4
    await an_ordinary_request_completes(server)


def _choices(server: FakeServer, path: str, n: int) -> int:
    """How many choices a request for `n` got, or the status that refused it."""
    client = server.client()
    text = "echo: " + " ".join(["w"] * 60)  # each choice runs a while
    try:
        if path.endswith("/chat/completions"):
            messages = [{"role": "user", "content": text}]
            done = client.chat.completions.create(model="fake-model", messages=messages, n=n)  # type: ignore[arg-type]
            return len(done.choices)
        return len(client.completions.create(model="fake-model", prompt=text, n=n).choices)
    except openai.APIStatusError as exc:
        return exc.status_code


@pytest.mark.parametrize("path", ROUTES)
async def test_two_requests_racing_for_the_last_slots_one_is_served(
    start_fake_server: StartServer, monkeypatch: pytest.MonkeyPatch, path: str
) -> None:
    """Eight slots, no waiting line, two `n: 8` requests at the same moment: all of one
    request's choices are admitted in one step, so one is served and the other refused,
    never both refused. Both are held just before submission and let go together, so
    their submissions meet at the scheduler in every round."""
    server = await start_fake_server(FakeEngine(step_delay=0.002), parallel=8, max_queue_depth=0)
    arrived, go, waiting = trio.Event(), trio.Event(), [0]

    async def held(generations: Any) -> Any:
        waiting[0] += 1
        if waiting[0] % 2 == 0:
            arrived.set()
        await go.wait()
        return await metered_all(generations)

    monkeypatch.setattr(chat, "metered_all", held)
    for _ in range(10):
        outcomes: list[int] = []

        async def ask(outcomes: list[int] = outcomes) -> None:
            outcomes.append(await in_thread(_choices, server, path, 8))

        with trio.fail_after(20):
            async with trio.open_nursery() as racing:
                racing.start_soon(ask)
                racing.start_soon(ask)
                await arrived.wait()
                go.set()
            arrived, go = trio.Event(), trio.Event()
            await until_idle(server)
        assert sorted(outcomes) == [8, 503]
    monkeypatch.undo()
    await an_ordinary_request_completes(server)
    assert await in_thread(_choices, server, path, 8) == 8  # the whole line is free again


async def until_idle(server: FakeServer) -> None:
    """Every slot has reported itself free again (the last response's slots too)."""
    async with httpx.AsyncClient(base_url=server.url, timeout=30) as http:
        while (await http.get("/health")).json()["slots"]["busy"] != 0:  # noqa: ASYNC110 - polled over HTTP
            await trio.sleep(0.01)
