"""`mlx.progress`: what a quiet stream sends while its response waits or reads its prompt.

Clients that give up on a stream without data events (only SSE comments) see these
instead, and the SDKs that stream must take them in their stride.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import httpx
import openai
import trio

from mlxcel.model.fake import FakeEngine

from support import (
    LONG,
    FakeServer,
    StartServer,
    in_thread,
    raw_request,
    read_releasing,
    read_until,
    wait_until,
)

LONG_INPUT = "echo: done " + "x" * 200
"""A prompt the fake reads two tokens a step: many quiet intervals of prefill."""


async def slow_prefill_server(start_fake_server: StartServer, **settings: Any) -> FakeServer:
    engine = FakeEngine(step_delay=0.01, prefill_chunk=2)
    return await start_fake_server(engine, sse_keepalive_secs=0.05, **settings)


async def occupy(http: httpx.AsyncClient, text: str) -> None:
    """Hold the one slot with a slow synchronous response."""
    r = await http.post("/v1/responses", json={"model": "fake-model", "input": text})
    assert r.status_code == 200, r.text


def frames(text: str) -> list[dict[str, Any]]:
    return [json.loads(line[6:]) for line in text.splitlines() if line.startswith("data: ")]


def _queued_progress(text: str) -> bool:
    """Whether a queued place was reported (in the whole lines read so far)."""
    whole = text.rsplit("\n", 1)[0]
    return any(e["type"] == "mlx.progress" and e["queue_position"] for e in frames(whole))


async def test_a_long_prefill_reports_the_prompt_read(start_fake_server: StartServer) -> None:
    server = await slow_prefill_server(start_fake_server)
    async with httpx.AsyncClient(base_url=server.url, timeout=30) as http:
        body = {"model": "fake-model", "input": LONG_INPUT, "stream": True}
        text = (await http.post("/v1/responses", json=body)).text
    events = frames(text)
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    assert ": keep-alive" not in text
    progress = [e for e in events if e["type"] == "mlx.progress"]
    assert len(progress) >= 3
    response_id = events[0]["response"]["id"]
    assert {p["response_id"] for p in progress} == {response_id}
    assert {p["queue_position"] for p in progress} == {None}  # a slot had it at once
    total = events[-1]["response"]["usage"]["input_tokens"]
    assert {p["prompt_tokens_total"] for p in progress} == {total}
    read = [p["prompt_tokens_read"] for p in progress]
    assert read == sorted(read)
    assert 0 < read[-1] <= total
    assert len(set(read)) > 1  # it moves
    assert events[-1]["type"] == "response.completed"


async def test_a_queued_response_reports_its_place(start_fake_server: StartServer) -> None:
    engine = FakeEngine()
    engine.hold(on="w0")  # the long response holds the slot until released
    server = await start_fake_server(engine, parallel=1, sse_keepalive_secs=0.05)
    async with httpx.AsyncClient(base_url=server.url, timeout=30) as http, trio.open_nursery() as n:
        n.start_soon(occupy, http, LONG)
        with trio.fail_after(10):
            await wait_until(lambda: engine.active == 1)
        body = {"model": "fake-model", "input": "echo: next", "stream": True}
        with trio.fail_after(10):
            text = await read_releasing(http, "/v1/responses", body, engine, _queued_progress)
    events = frames(text)
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    queued = [e for e in events if e["type"] == "mlx.progress" and e["queue_position"]]
    assert queued
    assert {e["queue_position"] for e in queued} == {1}
    assert {e["prompt_tokens_read"] for e in queued} == {0}
    assert events[-1]["type"] == "response.completed"
    assert events[-1]["response"]["output"][0]["content"][0]["text"] == "next"


async def test_with_progress_events_off_a_queued_response_gets_comments(
    start_fake_server: StartServer,
) -> None:
    engine = FakeEngine()
    engine.hold(on="w0")  # the long response holds the slot until released
    server = await start_fake_server(
        engine, parallel=1, sse_keepalive_secs=0.05, progress_events=False
    )
    async with httpx.AsyncClient(base_url=server.url, timeout=30) as http, trio.open_nursery() as n:
        n.start_soon(occupy, http, LONG)
        with trio.fail_after(10):
            await wait_until(lambda: engine.active == 1)
        body = {"model": "fake-model", "input": "echo: next", "stream": True}
        with trio.fail_after(10):
            text = await read_releasing(
                http, "/v1/responses", body, engine, lambda text: ": keep-alive\n\n" in text
            )
    assert ": keep-alive\n\n" in text
    assert "mlx.progress" not in text
    events = frames(text)
    assert [e["sequence_number"] for e in events] == list(range(len(events)))


async def test_a_client_that_leaves_while_queued_frees_its_place(
    start_fake_server: StartServer,
) -> None:
    engine = FakeEngine()
    engine.hold(on="w0")  # the long response holds the slot until released
    server = await start_fake_server(engine, parallel=1, max_queue_depth=1, sse_keepalive_secs=0.05)
    async with httpx.AsyncClient(base_url=server.url, timeout=30) as http, trio.open_nursery() as n:
        n.start_soon(occupy, http, LONG)
        with trio.fail_after(10):
            await wait_until(lambda: engine.active == 1)
        body = {"model": "fake-model", "input": "echo: gone", "stream": True}
        stream = await raw_request(server.url, body)
        seen = await read_until(stream, b"event: mlx.progress")
        assert b'"queue_position":1' in seen
        await stream.aclose()  # hang up while queued
        with trio.fail_after(5):
            while (await http.get("/health")).json()["slots"]["queued"]:  # noqa: ASYNC110 - polled over HTTP
                await trio.sleep(0.01)
        assert engine.active == 1  # the first is still running
        # The place is free again: the next request waits instead of a 503.
        answers: list[httpx.Response] = []

        async def next_one() -> None:
            answers.append(
                await http.post("/v1/responses", json={"model": "fake-model", "input": "echo: ok"})
            )

        n.start_soon(next_one)
        with trio.fail_after(5):
            while not (await http.get("/health")).json()["slots"]["queued"]:  # noqa: ASYNC110 - polled over HTTP
                await trio.sleep(0.01)
        engine.release()
    (r,) = answers
    assert r.status_code == 200, r.text
    assert r.json()["output"][0]["content"][0]["text"] == "ok"


async def test_the_sdk_stream_helper_takes_progress_in_its_stride(
    start_fake_server: StartServer,
) -> None:
    server = await slow_prefill_server(start_fake_server)
    client = server.client()

    def run() -> tuple[list[str], str]:
        with client.responses.stream(model="fake-model", input=LONG_INPUT) as stream:
            kinds = [event.type for event in stream]
            return kinds, stream.get_final_response().output_text

    kinds, text = await in_thread(run)
    assert "mlx.progress" in kinds
    assert kinds[-1] == "response.completed"
    assert text.startswith("done")


async def test_plain_sdk_stream_iteration_sees_progress(start_fake_server: StartServer) -> None:
    server = await slow_prefill_server(start_fake_server)
    client = server.client()

    def run() -> list[Any]:
        stream = client.responses.create(model="fake-model", input=LONG_INPUT, stream=True)
        with stream:
            return list(stream)

    events = await in_thread(run)
    progress = [e for e in events if e.type == "mlx.progress"]
    assert progress
    assert progress[-1].model_extra["prompt_tokens_total"] > 200
    assert [e.sequence_number for e in events] == list(range(len(events)))
    assert events[-1].type == "response.completed"


async def test_the_agents_sdk_streams_through_progress(start_fake_server: StartServer) -> None:
    from agents import Agent, Runner, set_tracing_disabled
    from agents.models.openai_responses import OpenAIResponsesModel

    set_tracing_disabled(True)
    server = await slow_prefill_server(start_fake_server)

    async def scenario() -> tuple[Any, list[str]]:
        client = openai.AsyncOpenAI(base_url=f"{server.url}/v1", api_key="sk-no-auth")
        agent = Agent(
            name="echo",
            instructions="Repeat after the user.",
            model=OpenAIResponsesModel(model="fake-model", openai_client=client),
        )
        result = Runner.run_streamed(agent, LONG_INPUT)
        seen = [
            event.data.type
            async for event in result.stream_events()
            if event.type == "raw_response_event"
        ]
        await client.close()
        return result.final_output, seen

    output, seen = await in_thread(asyncio.run, scenario())
    assert "mlx.progress" in seen
    assert str(output).startswith("done")
