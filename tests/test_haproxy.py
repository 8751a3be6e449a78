"""HAProxy in front of replicas: requests go round-robin to the backends, and a streamed
(chunked, server-sent events) answer passes through as it is written, not buffered."""

from __future__ import annotations

import functools
from collections.abc import Awaitable, Callable

import httpx
import pytest
import trio

import haproxy
from haproxy import Haproxy
from support import free_port

Handler = Callable[[trio.SocketStream], Awaitable[None]]


async def _read_request(stream: trio.SocketStream) -> bytes:
    seen = b""
    while b"\r\n\r\n" not in seen:
        chunk = await stream.receive_some()
        if not chunk:
            break
        seen += chunk
    return seen


async def _fixed(body: bytes, stream: trio.SocketStream) -> None:
    await _read_request(stream)
    head = f"HTTP/1.1 200 OK\r\nContent-Length: {len(body)}\r\nConnection: close\r\n\r\n"
    await stream.send_all(head.encode() + body)
    await stream.aclose()


async def _backend(nursery: trio.Nursery, handler: Handler) -> str:
    listeners = await nursery.start(functools.partial(trio.serve_tcp, handler, 0, host="127.0.0.1"))
    return f"http://127.0.0.1:{listeners[0].socket.getsockname()[1]}"


async def _proxy(backends: list[str]) -> Haproxy:
    return await trio.to_thread.run_sync(Haproxy, backends)


@pytest.mark.slow  # an haproxy process
async def test_requests_go_round_robin(nursery: trio.Nursery) -> None:
    one = await _backend(nursery, functools.partial(_fixed, b"one"))
    two = await _backend(nursery, functools.partial(_fixed, b"two"))
    with await _proxy([one, two]) as proxy:
        async with httpx.AsyncClient(base_url=proxy.url, timeout=30) as http:
            with trio.fail_after(30):
                bodies = [(await http.get("/")).content for _ in range(4)]
    assert bodies in ([b"one", b"two"] * 2, [b"two", b"one"] * 2)


@pytest.mark.slow  # an haproxy process
async def test_a_stream_passes_through_as_it_is_written(nursery: trio.Nursery) -> None:
    first_seen = trio.Event()

    async def events(stream: trio.SocketStream) -> None:
        await _read_request(stream)
        head = (
            "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
            "Transfer-Encoding: chunked\r\nConnection: close\r\n\r\n"
        )
        first, second = b"data: first\n\n", b"data: second\n\n"
        await stream.send_all(head.encode() + b"%x\r\n%s\r\n" % (len(first), first))
        # The second event is written only once the client has the first: a proxy that
        # buffered the answer would hold the first back, and the test would time out.
        await first_seen.wait()
        await stream.send_all(b"%x\r\n%s\r\n0\r\n\r\n" % (len(second), second))
        await stream.aclose()

    url = await _backend(nursery, events)
    with await _proxy([url]) as proxy:
        async with httpx.AsyncClient(base_url=proxy.url, timeout=30) as http:
            with trio.fail_after(30):
                async with http.stream("GET", "/events") as response:
                    assert response.status_code == 200
                    assert response.headers["content-type"] == "text/event-stream"
                    assert "content-encoding" not in response.headers
                    received = b""
                    async for chunk in response.aiter_bytes():
                        received += chunk
                        if received == b"data: first\n\n":
                            first_seen.set()
    assert first_seen.is_set()
    assert received == b"data: first\n\ndata: second\n\n"


@pytest.mark.slow  # an haproxy process
async def test_a_backend_that_is_down_gets_a_503() -> None:
    with await _proxy([f"http://127.0.0.1:{free_port()}"]) as proxy:  # nothing listens
        async with httpx.AsyncClient(base_url=proxy.url, timeout=30) as http:
            with trio.fail_after(30):
                assert (await http.get("/")).status_code == 503


def test_a_missing_binary_is_an_error_naming_the_install_step(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(haproxy, "BINARY", haproxy.BINARY.with_name("no-such-haproxy"))
    with pytest.raises(RuntimeError, match="test command installs it"):
        Haproxy(["http://127.0.0.1:1"])
