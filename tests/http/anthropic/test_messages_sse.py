"""`/v1/messages` streams read raw: every frame's `event:` is its data's `type` and
parses as the `anthropic` SDK's stream event, blocks are numbered from 0 without gaps,
each started block is stopped before the next starts, and `ping`s keep a quiet stream
alive (while its response waits in the line, or its prompt is read)."""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest
import trio
from anthropic._streaming import SSEDecoder
from anthropic.types import RawMessageStreamEvent
from pydantic import TypeAdapter

from mlxcel.model.fake import FakeEngine

from support import LONG, FakeServer, StartServer, an_ordinary_request_completes, read_releasing

EVENTS: TypeAdapter[Any] = TypeAdapter(RawMessageStreamEvent)
WEATHER = {
    "name": "get_weather",
    "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}},
}
CALL = '<tool_call>{"name": "get_weather", "arguments": {"city": "Paris"}}</tool_call>'


def body(text: str, **extra: Any) -> dict[str, Any]:
    return {
        "model": "fake-model",
        "max_tokens": 256,
        "messages": [{"role": "user", "content": text}],
        "stream": True,
        **extra,
    }


def frames(text: str) -> list[tuple[str | None, dict[str, Any]]]:
    """The stream's frames as the SDK's decoder splits them: (event, data)."""
    decoded = SSEDecoder().iter_bytes(iter([text.encode()]))
    return [(sse.event, json.loads(sse.data)) for sse in decoded]


def check_stream(text: str) -> list[dict[str, Any]]:
    """The frames' data (pings too), once every frame passed the rules of a well-formed
    stream."""
    found = frames(text)
    assert found
    for event, data in found:
        assert event == data["type"]
        if event not in ("ping", "error"):
            EVENTS.validate_python(data)  # as the SDK reads it
    assert found[0][0] == "message_start"  # the first event, before any ping
    data = [d for _, d in found if d["type"] != "ping"]
    assert [d["type"] for d in data[-2:]] == ["message_delta", "message_stop"]
    opened: int | None = None
    started = 0
    for d in data[1:-2]:
        if d["type"] == "content_block_start":
            assert opened is None  # the one before was stopped
            assert d["index"] == started  # contiguous from 0
            opened, started = d["index"], started + 1
        elif d["type"] == "content_block_delta":
            assert d["index"] == opened
        else:
            assert d == {"type": "content_block_stop", "index": opened}
            opened = None
    assert opened is None  # every start has its stop
    return [d for _, d in found]


async def stream_text(
    server: FakeServer, payload: dict[str, Any], path: str = "/v1/messages"
) -> str:
    async with httpx.AsyncClient(base_url=server.url, timeout=30) as http:
        r = await http.post(path, json=payload, headers={"anthropic-version": "2023-06-01"})
    assert r.status_code == 200, r.text
    assert r.headers["content-type"].startswith("text/event-stream")
    assert r.headers["request-id"].startswith("req_")
    return r.text


async def occupy(http: httpx.AsyncClient) -> None:
    """Hold the one slot with a long synchronous response (the engine holds it)."""
    r = await http.post("/v1/responses", json={"model": "fake-model", "input": LONG})
    assert r.status_code == 200, r.text


async def test_text_and_a_tool_use_stream_as_contiguous_blocks(fake_server: FakeServer) -> None:
    text = await stream_text(
        fake_server, body(f"echo: Checking. {CALL}", tools=[WEATHER]), "/v1/messages?beta=true"
    )
    data = check_stream(text)
    starts = [d["content_block"] for d in data if d["type"] == "content_block_start"]
    assert [s["type"] for s in starts] == ["text", "tool_use"]
    assert starts[1]["name"] == "get_weather"
    assert starts[1]["input"] == {}
    deltas = [d["delta"] for d in data if d["type"] == "content_block_delta"]
    assert "".join(d["text"] for d in deltas if d["type"] == "text_delta") == "Checking. "
    partial = [d["partial_json"] for d in deltas if d["type"] == "input_json_delta"]
    assert len(partial) > 1  # streamed as the parser releases it
    assert json.loads("".join(partial)) == {"city": "Paris"}
    last = data[-2]
    assert last["delta"] == {"stop_reason": "tool_use", "stop_sequence": None}
    assert last["usage"]["output_tokens"] > 0
    assert data[0]["message"]["usage"]["input_tokens"] == sum(
        last["usage"][k]
        for k in ("input_tokens", "cache_read_input_tokens", "cache_creation_input_tokens")
    )


async def test_a_thinking_block_ends_with_its_signature(start_fake_server: StartServer) -> None:
    server = await start_fake_server(opens_reasoning=True)
    payload = body("echo: plan it</think> the answer", thinking={"type": "adaptive"})
    data = check_stream(await stream_text(server, payload))
    starts = [d["content_block"]["type"] for d in data if d["type"] == "content_block_start"]
    assert starts == ["thinking", "text"]
    thinking = [d["delta"] for d in data if d.get("index") == 0 and "delta" in d]
    assert "".join(d.get("thinking", "") for d in thinking) == "plan it"
    assert thinking[-1]["type"] == "signature_delta"
    assert len(thinking[-1]["signature"]) == 64
    assert [d["type"] for d in thinking[:-1]] == ["thinking_delta"] * (len(thinking) - 1)


async def test_pings_while_the_prompt_is_read(start_fake_server: StartServer) -> None:
    engine = FakeEngine(step_delay=0.01, prefill_chunk=2)  # a long prefill
    server = await start_fake_server(engine, sse_keepalive_secs=0.05)
    text = await stream_text(server, body("echo: done " + "x" * 200))
    check_stream(text)
    # `message_start` waits for the prompt (its usage says what the cache served): until
    # then SSE comments keep the stream alive, since no event may come before it.
    opening = text[: text.index("event: message_start")]
    assert opening.count(": keep-alive\n\n") >= 3
    assert opening.replace(": keep-alive\n\n", "") == ""


async def test_pings_while_queued(start_fake_server: StartServer) -> None:
    engine = FakeEngine()
    engine.hold(on="w0")  # the long response holds the one slot until released
    server = await start_fake_server(engine, parallel=1, sse_keepalive_secs=0.05)
    async with httpx.AsyncClient(base_url=server.url, timeout=30) as http, trio.open_nursery() as n:
        n.start_soon(occupy, http)
        with trio.fail_after(10):
            while engine.active != 1:  # noqa: ASYNC110 - the engine's state is another thread's
                await trio.sleep(0.01)
            text = await read_releasing(
                http,
                "/v1/messages",
                body("echo: next"),
                engine,
                lambda t: t.count(": keep-alive") >= 2,
            )
    data = check_stream(text)
    # SSE comments while queued; `message_start` once the prompt is read (its usage known).
    opening = text[: text.index("event: message_start")]
    assert opening.count(": keep-alive\n\n") >= 2
    assert opening.replace(": keep-alive\n\n", "") == ""
    assert data[-2]["delta"]["stop_reason"] == "end_turn"


async def test_a_failure_after_the_200_is_an_error_event(start_fake_server: StartServer) -> None:
    server = await start_fake_server(FakeEngine(fail_on="poison"))
    async with httpx.AsyncClient(base_url=server.url, timeout=30) as http:
        r = await http.post("/v1/messages", json=body("echo: a b poison c"))
    assert r.status_code == 200
    found = frames(r.text)
    event, data = found[-1]
    assert event == "error"
    assert data["type"] == "error"
    assert data["error"]["type"] == "api_error"
    assert "message_stop" not in [e for e, _ in found]
    await an_ordinary_request_completes(server)


@pytest.mark.parametrize("stream", [True, False])
async def test_a_full_line_is_529_overloaded(start_fake_server: StartServer, stream: bool) -> None:
    engine = FakeEngine()
    engine.hold()
    server = await start_fake_server(engine, parallel=1, max_queue_depth=0)
    async with httpx.AsyncClient(base_url=server.url, timeout=30) as http, trio.open_nursery() as n:
        n.start_soon(occupy, http)
        with trio.fail_after(10):
            while engine.active != 1:  # noqa: ASYNC110 - the engine's state is another thread's
                await trio.sleep(0.01)
        payload = body("echo: more", stream=stream)
        r = await http.post("/v1/messages", json=payload)
        engine.release()
    assert r.status_code == 529, r.text
    assert r.json()["error"]["type"] == "overloaded_error"
    assert r.headers["retry-after"] == "1"
    await an_ordinary_request_completes(server)
