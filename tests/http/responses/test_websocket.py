"""`/v1/responses` in WebSocket mode over real 127.0.0.1: `response.create` messages in,
the SSE stream's events out (one JSON text message each), `store: false` responses
continued on their own socket only, and hostile clients that never cost the server its
health or a slot."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import httpx
import pytest
import trio
from websockets.asyncio.client import connect as connect_async
from websockets.exceptions import InvalidStatus, WebSocketException
from websockets.sync.client import connect
from ws_client import Socket, open_socket, socket_url

from mlxcel.model.fake import FakeEngine

from support import StartServer, an_ordinary_request_completes, in_thread, wait_until


async def _health(url: str) -> dict[str, Any]:
    async with httpx.AsyncClient(base_url=url, timeout=30) as http:
        response = await http.get("/health")
        assert response.status_code == 200
        found: dict[str, Any] = response.json()
        return found


async def _completed(socket: Socket, **body: Any) -> dict[str, Any]:
    """Create a response on `socket` and read its events; its final object."""
    await socket.create(**body)
    events = await socket.until_end()
    assert events[0]["type"] == "response.created"
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    assert events[-1]["type"] == "response.completed", events[-1]
    response: dict[str, Any] = events[-1]["response"]
    return response


async def test_two_responses_one_after_the_other_on_one_socket(
    start_fake_server: StartServer,
) -> None:
    server = await start_fake_server()
    socket = await open_socket(server)
    first = await _completed(socket, input="echo: one two")
    second = await _completed(socket, input="echo: three")
    assert first["output"][0]["content"][0]["text"] == "one two"
    assert second["output"][0]["content"][0]["text"] == "three"
    assert first["id"] != second["id"]
    await socket.aclose()
    await an_ordinary_request_completes(server)


async def test_the_events_are_the_sse_streams_own(start_fake_server: StartServer) -> None:
    server = await start_fake_server()
    socket = await open_socket(server)
    await socket.create(input="echo: same events")
    over_socket = [e["type"] for e in await socket.until_end()]
    async with httpx.AsyncClient(base_url=server.url, timeout=30) as http:
        body = {"model": "fake-model", "input": "echo: same events", "stream": True}
        response = await http.post("/v1/responses", json=body)
    over_sse = [
        json.loads(line[len("data: ") :])["type"]
        for line in response.text.splitlines()
        if line.startswith("data: ")
    ]
    assert over_socket == over_sse
    await socket.aclose()


async def test_a_store_false_response_continues_on_its_own_socket(
    start_fake_server: StartServer,
) -> None:
    engine = FakeEngine(step_delay=0.002)
    server = await start_fake_server(engine)
    socket = await open_socket(server)
    first = await _completed(socket, input="echo: remember tangerine", store=False)
    assert first["store"] is False
    second = await _completed(
        socket, input="echo: and now", store=False, previous_response_id=first["id"]
    )
    assert second["previous_response_id"] == first["id"]
    assert "remember tangerine" in engine.prompts[-1]  # the first turn was in the prompt
    third = await _completed(socket, input="echo: again", previous_response_id=second["id"])
    assert "and now" in engine.prompts[-1]
    assert "remember tangerine" in engine.prompts[-1]
    assert third["status"] == "completed"
    await socket.aclose()


async def test_a_store_false_response_is_not_found_on_another_socket(
    start_fake_server: StartServer,
) -> None:
    server = await start_fake_server()
    socket = await open_socket(server)
    first = await _completed(socket, input="echo: only here", store=False)
    await socket.aclose()
    again = await open_socket(server)
    await again.create(input="echo: more", previous_response_id=first["id"])
    error = await again.receive()
    assert error["type"] == "error"
    assert error["status"] == 400
    assert error["error"]["code"] == "previous_response_not_found"
    assert error["error"]["param"] == "previous_response_id"
    await _completed(again, input="echo: still serving")
    await again.aclose()


async def test_a_failed_continuation_forgets_the_response_it_named(
    start_fake_server: StartServer,
) -> None:
    server = await start_fake_server()
    socket = await open_socket(server)
    first = await _completed(socket, input="echo: kept", store=False)
    await socket.create(input="echo: bad", previous_response_id=first["id"], temperature=9)
    error = await socket.receive()
    assert error["type"] == "error"
    assert error["status"] == 400
    await socket.create(input="echo: retry", previous_response_id=first["id"])
    retry = await socket.receive()
    assert retry["type"] == "error"
    assert retry["error"]["code"] == "previous_response_not_found"
    await socket.aclose()


async def test_a_bad_call_id_forgets_the_response_it_continued(
    start_fake_server: StartServer,
) -> None:
    server = await start_fake_server()
    socket = await open_socket(server)
    call = '<tool_call>{"name": "f", "arguments": {}}</tool_call>'
    tools = [{"type": "function", "name": "f", "parameters": {"type": "object"}}]
    first = await _completed(socket, input=f"echo: {call}", tools=tools, store=False)
    assert first["output"][0]["type"] == "function_call"
    output = {"type": "function_call_output", "call_id": "call_nobody_made", "output": "x"}
    await socket.create(input=[output], previous_response_id=first["id"], tools=tools)
    error = await socket.receive()
    assert error["type"] == "error"
    assert error["status"] == 400
    assert error["error"]["type"] == "invalid_request_error"
    assert error["error"]["param"] == "input[0].call_id"
    good = {**output, "call_id": first["output"][0]["call_id"]}
    await socket.create(input=[good], previous_response_id=first["id"], tools=tools)
    retry = await socket.receive()
    assert retry["type"] == "error"
    assert retry["error"]["code"] == "previous_response_not_found"
    await _completed(socket, input="echo: still serving")
    await socket.aclose()
    await an_ordinary_request_completes(server)


async def test_stored_responses_continue_from_any_socket(start_fake_server: StartServer) -> None:
    engine = FakeEngine(step_delay=0.002)
    server = await start_fake_server(engine)
    socket = await open_socket(server)
    first = await _completed(socket, input="echo: stored lemon", store=True)
    await socket.aclose()
    again = await open_socket(server)
    second = await _completed(again, input="echo: next", previous_response_id=first["id"])
    assert second["previous_response_id"] == first["id"]
    assert "stored lemon" in engine.prompts[-1]
    await again.aclose()
    retrieved = await in_thread(server.client().responses.retrieve, first["id"])
    assert retrieved.status == "completed"


async def test_a_body_error_is_the_one_http_gives(start_fake_server: StartServer) -> None:
    server = await start_fake_server()
    bad = {"model": "fake-model", "input": "hi", "temperature": "hot"}
    async with httpx.AsyncClient(base_url=server.url, timeout=30) as http:
        over_http = await http.post("/v1/responses", json=bad)
    socket = await open_socket(server)
    await socket.send({"type": "response.create", **bad})
    error = await socket.receive()
    assert error["type"] == "error"
    assert error["status"] == over_http.status_code == 400
    assert error["error"] == over_http.json()["error"]
    await socket.create(model="no-such-model", input="hi")
    missing = await socket.receive()
    assert missing["status"] == 404
    assert missing["error"]["code"] == "model_not_found"
    await _completed(socket, input="echo: fine")
    await socket.aclose()


async def test_a_bad_key_gets_an_error_event_then_a_close(start_fake_server: StartServer) -> None:
    server = await start_fake_server(api_keys=("sk-right",))
    socket = await open_socket(server, api_key="sk-wrong")
    error = await socket.receive()
    assert error["type"] == "error"
    assert error["status"] == 401
    assert error["error"]["code"] == "invalid_api_key"
    assert await socket.closed() == 1008
    keyed = await open_socket(server, api_key="sk-right")
    await _completed(keyed, input="echo: with the key")
    await keyed.aclose()


async def test_a_binary_frame_and_invalid_json_are_error_events(
    start_fake_server: StartServer,
) -> None:
    server = await start_fake_server()
    socket = await open_socket(server)
    await socket.send(b'{"type": "response.create"}')
    binary = await socket.receive()
    assert binary["type"] == "error"
    assert binary["status"] == 400
    await socket.send("{not json")
    broken = await socket.receive()
    assert broken["status"] == 400
    assert broken["error"]["code"] == "invalid_json"
    await socket.send({"type": "response.cancel"})
    unknown = await socket.receive()
    assert unknown["status"] == 400
    assert unknown["error"]["param"] == "type"
    await _completed(socket, input="echo: after all that")
    await socket.aclose()
    await an_ordinary_request_completes(server)


async def test_a_ten_megabyte_frame_is_refused_and_the_socket_lives_on(
    start_fake_server: StartServer,
) -> None:
    server = await start_fake_server()
    socket = await open_socket(server)
    await socket.send("[" + "1," * 5_000_000 + "1]")
    error = await socket.receive()
    assert error["type"] == "error"
    assert error["status"] == 400
    await _completed(socket, input="echo: small again")
    await socket.aclose()
    await an_ordinary_request_completes(server)


async def test_closing_mid_response_frees_the_slot(start_fake_server: StartServer) -> None:
    engine = FakeEngine(step_delay=0.002)
    server = await start_fake_server(engine, parallel=1)
    engine.hold()
    socket = await open_socket(server)
    await socket.create(input="echo: a long answer never read")
    assert (await socket.receive())["type"] == "response.created"
    with trio.fail_after(20):
        await wait_until(lambda: bool(engine.prompts))
    await socket.aclose()
    engine.release()
    with trio.fail_after(20):
        while (await _health(server.url))["slots"]["busy"] != 0:  # noqa: ASYNC110 - polled over HTTP
            await trio.sleep(0.02)
    await an_ordinary_request_completes(server)


async def test_a_second_create_while_one_runs_is_an_error_event(
    start_fake_server: StartServer,
) -> None:
    engine = FakeEngine(step_delay=0.002)
    server = await start_fake_server(engine)
    engine.hold()
    socket = await open_socket(server)
    await socket.create(input="echo: the first")
    assert (await socket.receive())["type"] == "response.created"
    await socket.create(input="echo: the second")
    events = [await socket.receive()]
    while events[-1]["type"] != "error":
        events.append(await socket.receive())
    assert events[-1]["status"] == 400
    assert events[-1]["error"]["code"] == "response_in_progress"
    engine.release()
    rest = await socket.until_end()
    assert rest[-1]["type"] == "response.completed"
    assert rest[-1]["response"]["output"][0]["content"][0]["text"] == "the first"
    await _completed(socket, input="echo: the second, now")
    await socket.aclose()


async def test_an_idle_socket_is_closed(start_fake_server: StartServer) -> None:
    server = await start_fake_server(websocket_idle_secs=0.5)
    socket = await open_socket(server)
    await _completed(socket, input="echo: then silence")
    with trio.fail_after(20):
        assert await socket.closed() == 1000
    await an_ordinary_request_completes(server)


async def _hundred_sockets(url: str) -> list[str]:
    """Open 100 sockets at once, each asking for one response; how each ended: the
    terminal event's type, or `refused` for a socket refused or closed cleanly."""

    async def one(i: int) -> str:
        try:
            async with connect_async(url, open_timeout=60) as socket:
                body = {"type": "response.create", "model": "fake-model", "input": f"echo: {i}"}
                await socket.send(json.dumps(body))
                while True:
                    event = json.loads(await asyncio.wait_for(socket.recv(), 60))
                    if event["type"] in ("response.completed", "error"):
                        return str(event["type"])
        except (WebSocketException, OSError):
            return "refused"

    return list(await asyncio.gather(*(one(i) for i in range(100))))


async def test_a_hundred_sockets_at_once_are_answered_or_refused_cleanly(
    start_fake_server: StartServer,
) -> None:
    server = await start_fake_server(FakeEngine(step_delay=0.001))
    ends = await in_thread(asyncio.run, _hundred_sockets(socket_url(server)))
    assert len(ends) == 100
    assert set(ends) <= {"response.completed", "error", "refused"}
    assert "response.completed" in ends
    await an_ordinary_request_completes(server)
    assert (await _health(server.url))["slots"]["busy"] == 0


async def test_a_web_pages_socket_from_an_unlisted_origin_is_refused(
    start_fake_server: StartServer,
) -> None:
    """A page may open a socket to any address without asking first: only a listed
    origin's page gets one (a client that sends no `Origin` is not a browser's)."""
    server = await start_fake_server()
    url = socket_url(server)
    with pytest.raises(InvalidStatus) as refused:
        await in_thread(
            connect, url, additional_headers={"Origin": "https://evil.example"}, legacy=True
        )
    assert refused.value.response.status_code == 403
    await an_ordinary_request_completes(server)
