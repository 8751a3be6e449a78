"""Keep-alive connections after an answer sent before the request body arrived.

An early answer (a 404 for an unknown conversation, a 401) used to leave its connection
neither recycled nor closed, so the client's next request on it waited forever. Now an
answer closes its connection only while a declared body is unread (or the body was
declared both ways); a quick answer to a request without a body keeps it.
"""

from __future__ import annotations

import json

import pytest
import requests
import trio

from support import FakeServer, StartServer, in_thread


async def answer_before_body(url: str, path: str, headers: str = "") -> bytes:
    """Send a POST's head, read the answer, then send the body; what follows on the
    connection (until it closes) is returned after the answer."""
    host, port = url.removeprefix("http://").split(":")
    body = json.dumps({"metadata": {"k": "v"}}).encode()
    head = (
        f"POST {path} HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n"
        f"{headers}Content-Length: {len(body)}\r\n\r\n"
    ).encode()
    stream = await trio.open_tcp_stream(host, int(port))
    async with stream:
        await stream.send_all(head)
        seen = b""
        with trio.fail_after(5):
            while b"}}" not in seen:  # the whole error object
                chunk = await stream.receive_some()
                assert chunk, seen
                seen += chunk
        try:
            await stream.send_all(body)
            with trio.fail_after(5):  # the server closes the connection
                while chunk := await stream.receive_some():
                    seen += chunk
        except trio.BrokenResourceError:
            pass  # closed before the body went out: as good
    return seen


@pytest.mark.parametrize(
    ("api_keys", "headers", "status"),
    [((), "", b"404"), (("sk-right",), "Authorization: Bearer sk-wrong\r\n", b"401")],
)
async def test_an_answer_before_the_body_closes_its_connection(
    start_fake_server: StartServer, api_keys: tuple[str, ...], headers: str, status: bytes
) -> None:
    server = await start_fake_server(api_keys=api_keys)
    seen = await answer_before_body(server.url, "/v1/conversations/conv_missing", headers)
    head = seen.split(b"\r\n\r\n", 1)[0].lower()
    assert head.startswith(b"http/1.1 " + status)
    assert b"connection: close" in head


def post_many(url: str, count: int) -> list[int]:
    """POSTs that get an early 404, one after another on one keep-alive session."""
    statuses = []
    with requests.Session() as session:
        for size in range(count):
            body = {"metadata": {"k": "v" * size * 37}}
            r = session.post(f"{url}/v1/conversations/conv_missing", json=body, timeout=5)
            statuses.append(r.status_code)
        statuses.append(session.get(f"{url}/v1/models", timeout=5).status_code)
    return statuses


async def test_early_answers_never_stall_a_client(fake_server: FakeServer) -> None:
    statuses = await in_thread(post_many, fake_server.url, 40)
    assert statuses == [404] * 40 + [200]


async def exchange_raw(url: str, requests_text: str, answers: int) -> list[bytes]:
    """Send `requests_text` (pipelined requests) on one connection; the heads of the
    first `answers` answers."""
    host, port = url.removeprefix("http://").split(":")
    stream = await trio.open_tcp_stream(host, int(port))
    async with stream:
        await stream.send_all(requests_text.replace("HOST", host).encode())
        seen = b""
        with trio.fail_after(10):
            while seen.count(b"HTTP/1.1 ") < answers or not seen.endswith(b"}"):
                chunk = await stream.receive_some()
                assert chunk, seen
                seen += chunk
    return [part.split(b"\r\n\r\n", 1)[0].lower() for part in seen.split(b"HTTP/1.1 ")[1:]]


@pytest.mark.parametrize("path", ["/v1/models", "/v1/responses/resp_missing", "/health"])
async def test_a_quick_answer_to_a_request_without_a_body_keeps_its_connection(
    fake_server: FakeServer, path: str
) -> None:
    """Before: every answer given before the app read the (empty) body said
    `Connection: close` (20 of 20 `GET /v1/models`)."""
    get = f"GET {path} HTTP/1.1\r\nHost: HOST\r\n\r\n"
    heads = await exchange_raw(fake_server.url, get * 3, 3)
    assert len(heads) == 3
    assert not [head for head in heads if b"connection: close" in head]


async def test_a_refused_key_with_a_request_pipelined_behind_it_answers_both(
    start_fake_server: StartServer,
) -> None:
    server = await start_fake_server(api_keys=("sk-right",))
    wrong = "GET /v1/models HTTP/1.1\r\nHost: HOST\r\nAuthorization: Bearer sk-wrong\r\n\r\n"
    right = "GET /v1/models HTTP/1.1\r\nHost: HOST\r\nAuthorization: Bearer sk-right\r\n\r\n"
    for _ in range(10):
        heads = await exchange_raw(server.url, wrong + right, 2)
        assert [head[:3] for head in heads] == [b"401", b"200"]


async def test_a_body_declared_both_ways_is_answered_and_its_connection_closed(
    fake_server: FakeServer,
) -> None:
    """RFC 9112 §6.3: a request with both `Transfer-Encoding` and `Content-Length` may be
    a smuggling attempt; its connection must not carry another request."""
    body = b'{"model": "fake-model", "input": "hi"}'
    chunked = b"%x\r\n%s\r\n0\r\n\r\n" % (len(body), body)
    head = (
        "POST /v1/responses HTTP/1.1\r\nHost: HOST\r\nContent-Type: application/json\r\n"
        f"Transfer-Encoding: chunked\r\nContent-Length: {len(chunked)}\r\n\r\n"
    )
    heads = await exchange_raw(fake_server.url, head + chunked.decode(), 1)
    assert b"connection: close" in heads[0]
