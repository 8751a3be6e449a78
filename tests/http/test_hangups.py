"""Unlucky clients over real HTTP: hang-ups, stalled readers, cancels racing the end,
requesters that leave the queue. After each, the server answers and a slot is free."""

from __future__ import annotations

import json
import socket
from typing import Any

import httpx
import trio

from mlxcel.model.fake import FakeEngine

from support import FakeServer, StartServer, in_thread

LONG = "echo: " + " ".join(f"w{i}" for i in range(400))


async def raw_request(
    url: str, body: dict[str, Any], *, rcvbuf: int | None = None
) -> trio.SocketStream:
    """A whole POST /v1/responses sent on a raw connection that is then left to the caller."""
    host, port = url.removeprefix("http://").split(":")
    payload = json.dumps(body).encode()
    head = (
        f"POST /v1/responses HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(payload)}\r\n\r\n"
    ).encode()
    sock = trio.socket.socket()
    if rcvbuf is not None:  # a small window: the server's writes block once it is full
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
    await sock.connect((host, int(port)))
    stream = trio.SocketStream(sock)
    await stream.send_all(head + payload)
    return stream


async def read_until(stream: trio.SocketStream, marker: bytes) -> bytes:
    seen = b""
    while marker not in seen:
        chunk = await stream.receive_some()
        assert chunk, f"the stream ended before {marker!r}: {seen[-500:]!r}"
        seen += chunk
    return seen


async def an_ordinary_request_completes(server: FakeServer, within: float = 10) -> None:
    """`/health` answers and a short request completes (retrying 503s while a slot frees)."""
    async with httpx.AsyncClient(base_url=server.url, timeout=30) as http:
        with trio.fail_after(within):
            assert (await http.get("/health")).status_code == 200
            while True:
                r = await http.post("/v1/responses", json={"model": "fake-model", "input": "hi"})
                if r.status_code != 503:
                    break
                await trio.sleep(0.02)
    assert r.status_code == 200, r.text
    assert r.json()["status"] == "completed"


async def test_hanging_up_right_after_sending_never_leaks_a_slot(
    start_fake_server: StartServer,
) -> None:
    server = await start_fake_server(FakeEngine(step_delay=0.001), parallel=1, max_queue_depth=0)
    for i in range(30):
        body = {"model": "fake-model", "input": "echo: a b c", "stream": i % 2 == 0}
        stream = await raw_request(server.url, body)
        await trio.sleep(i % 3 * 0.001)  # hang up at slightly different moments
        await stream.aclose()
    await an_ordinary_request_completes(server)


async def test_a_reader_that_stops_reading_is_dropped_after_the_send_deadline(
    start_fake_server: StartServer,
) -> None:
    # Six 1 MB words: more than the kernel buffers between the server and a client
    # whose receive window is tiny, so the server's writes block.
    word = "x" * 1_000_000
    engine = FakeEngine()
    server = await start_fake_server(
        engine, parallel=1, max_queue_depth=0, send_timeout_secs=0.5, context_length=8_000_000
    )
    body = {
        "model": "fake-model",
        "input": "echo: " + " ".join([word] * 6),
        "stream": True,
        "store": True,
    }
    stalled = await raw_request(server.url, body, rcvbuf=4096)
    seen = await read_until(stalled, b"response.created")
    response_id = seen.split(b'"id":"', 1)[1].split(b'"', 1)[0].decode()
    # The stalled client reads nothing more; its slot is freed after the deadline.
    await an_ordinary_request_completes(server, within=15)
    client = server.client()
    with trio.fail_after(10):  # a cancel never waits on the stalled client
        cancelled = await in_thread(client.responses.cancel, response_id)
    assert cancelled.status == "cancelled"
    await stalled.aclose()


async def test_a_queued_requester_that_leaves_leaves_the_line(
    start_fake_server: StartServer,
) -> None:
    server = await start_fake_server(FakeEngine(step_delay=0.01), parallel=1, max_queue_depth=1)
    running = await raw_request(server.url, {"model": "fake-model", "input": LONG, "stream": True})
    await read_until(running, b"response.output_text.delta")
    # A synchronous request takes the one queue place, then its client gives up.
    queued = await raw_request(server.url, {"model": "fake-model", "input": "echo: q"})
    await trio.sleep(0.2)
    await queued.aclose()
    await trio.sleep(0.2)
    # Its place is free at once: a newcomer is queued, not refused.
    body = {"model": "fake-model", "input": "echo: next", "stream": True}
    async with (
        httpx.AsyncClient(base_url=server.url, timeout=30) as http,
        http.stream("POST", "/v1/responses", json=body) as r,
    ):
        assert r.status_code == 200
    await running.aclose()
    await an_ordinary_request_completes(server)


async def test_a_failing_admission_fails_that_response_alone(
    start_fake_server: StartServer,
) -> None:
    server = await start_fake_server(FakeEngine(fail_insert_on="poison"), parallel=1)
    client = server.client()
    resp = await in_thread(client.responses.create, model="fake-model", input="echo: poison")
    assert resp.status == "failed"
    assert resp.error is not None
    assert resp.error.code == "server_error"
    await an_ordinary_request_completes(server)
