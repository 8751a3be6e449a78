"""The HTTP edge against hostile and slow clients: body limits and deadlines, slow
headers, the connection cap, strict JSON in and out, the API key and the content type.
After each, the server answers and an ordinary request completes."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import httpx
import pytest
import trio

from mlxcel.http.body import MAX_BODY_BYTES

from support import FakeServer, StartServer, an_ordinary_request_completes


def strict_json(text: str | bytes) -> Any:
    """JSON as every strict parser reads it: no NaN or Infinity."""

    def refuse(name: str) -> Any:
        raise ValueError(f"not JSON: {name}")

    return json.loads(text, parse_constant=refuse)


def assert_openai_error(response: httpx.Response, status: int, code: str | None) -> None:
    assert response.status_code == status, response.text
    error = strict_json(response.content)["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["message"]
    assert error["code"] == code


@pytest.fixture
async def open_raw() -> AsyncIterator[Callable[[FakeServer], Awaitable[trio.SocketStream]]]:
    """Opens raw connections to a server, all closed when the test ends."""
    streams: list[trio.SocketStream] = []

    async def connect(server: FakeServer) -> trio.SocketStream:
        host, port = server.url.removeprefix("http://").split(":")
        streams.append(await trio.open_tcp_stream(host, int(port)))
        return streams[-1]

    yield connect
    for stream in streams:
        await stream.aclose()


async def read_to_end(stream: trio.SocketStream) -> bytes:
    data = b""
    while chunk := await stream.receive_some():
        data += chunk
    return data


RawOpener = Callable[[FakeServer], Awaitable[trio.SocketStream]]


def head(path: str, *headers: str) -> bytes:
    lines = [f"POST {path} HTTP/1.1", "Host: 127.0.0.1", *headers, "", ""]
    return "\r\n".join(lines).encode()


async def test_a_content_length_over_the_limit_is_refused_before_the_body(
    fake_server: FakeServer,
    open_raw: RawOpener,
) -> None:
    stream = await open_raw(fake_server)
    declared = MAX_BODY_BYTES + 1
    await stream.send_all(
        head("/v1/responses", "Content-Type: application/json", f"Content-Length: {declared}")
        + b"{"
    )
    with trio.fail_after(10):  # the body never comes: the answer must not wait for it
        answer = await read_to_end(stream)
    assert answer.startswith(b"HTTP/1.1 413")
    body = answer.split(b"\r\n\r\n", 1)[1]
    assert strict_json(body)["error"]["code"] == "request_too_large"
    await an_ordinary_request_completes(fake_server)


async def test_an_endless_chunked_body_stops_being_read_at_the_limit(
    fake_server: FakeServer,
    open_raw: RawOpener,
) -> None:
    stream = await open_raw(fake_server)
    await stream.send_all(
        head("/v1/responses", "Content-Type: application/json", "Transfer-Encoding: chunked")
    )
    chunk = b"x" * 65536
    frame = b"%x\r\n" % len(chunk) + chunk + b"\r\n"
    sent = 0
    answer = b""

    async def send_for_ever(cancel_scope: trio.CancelScope) -> None:
        nonlocal sent
        try:
            while True:
                await stream.send_all(frame)
                sent += len(chunk)
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            cancel_scope.cancel()  # the server closed its end; the reader has what came

    with trio.fail_after(60):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(send_for_ever, nursery.cancel_scope)
            while b"\r\n\r\n" not in answer:
                data = await stream.receive_some()
                assert data, "the server closed the connection without an answer"
                answer += data
            at_answer = sent
            nursery.cancel_scope.cancel()
    assert answer.startswith(b"HTTP/1.1 413"), answer[:200]
    assert at_answer <= MAX_BODY_BYTES + 16 * 1024 * 1024  # no more than buffers hold
    with trio.fail_after(10):  # and the connection closes
        await read_to_end(stream)
    await an_ordinary_request_completes(fake_server)


async def test_a_body_that_does_not_arrive_in_time_is_a_408(
    start_fake_server: StartServer,
    open_raw: RawOpener,
) -> None:
    server = await start_fake_server(body_timeout_secs=0.5)
    stream = await open_raw(server)
    await stream.send_all(
        head("/v1/responses", "Content-Type: application/json", "Content-Length: 100") + b'{"m'
    )
    with trio.fail_after(10):
        answer = await read_to_end(stream)
    assert answer.startswith(b"HTTP/1.1 408"), answer[:200]
    body = answer.split(b"\r\n\r\n", 1)[1]
    assert strict_json(body)["error"]["code"] == "request_timeout"
    await an_ordinary_request_completes(server)


async def test_a_connection_that_sends_no_headers_in_time_is_closed(
    start_fake_server: StartServer,
    open_raw: RawOpener,
) -> None:
    server = await start_fake_server(read_timeout_secs=0.5)
    slow = await open_raw(server)
    await slow.send_all(b"POST /v1/responses HTTP/1.1\r\nHo")  # and then nothing
    with trio.fail_after(10):
        assert await read_to_end(slow) == b""
    idle = await open_raw(server)  # a connection that never says anything
    with trio.fail_after(10):
        assert await read_to_end(idle) == b""
    await an_ordinary_request_completes(server)


async def test_connections_over_the_cap_wait_until_one_closes(
    start_fake_server: StartServer,
    open_raw: RawOpener,
) -> None:
    server = await start_fake_server(max_connections=2)
    holders = [await open_raw(server) for _ in range(2)]
    answered = trio.Event()

    async def ask() -> None:
        async with httpx.AsyncClient(base_url=server.url, timeout=30) as http:
            assert (await http.get("/health")).status_code == 200
        answered.set()

    async with trio.open_nursery() as nursery:
        nursery.start_soon(ask)
        with trio.move_on_after(0.5):
            await answered.wait()
        assert not answered.is_set(), "a third connection was served with the cap at two"
        await holders[0].aclose()
        with trio.fail_after(10):
            await answered.wait()
    await holders[1].aclose()
    await an_ordinary_request_completes(server)


@pytest.mark.parametrize(
    "raw",
    [
        b'{"model": "fake-model", "input": "hi", "temperature": NaN}',
        b'{"model": "fake-model", "input": "hi", "top_p": Infinity}',
        b'{"model": "fake-model", "input": "hi", "temperature": -1e400}',
        b'{"model": "fake-model", "input": "hi", "tools": [{"type": "function", "name": "f",'
        b' "parameters": {"type": "object", "properties": {"x": {"maximum": NaN}}}}]}',
        b'{"model": "fake-model", "input": "hi", "text": {"format": {"type": "json_schema",'
        b' "name": "s", "schema": {"type": "number", "minimum": -Infinity}}}}',
    ],
    ids=["nan", "infinity", "overflow", "nan-in-tools", "infinity-in-schema"],
)
async def test_json_with_nan_or_infinity_is_a_400(fake_server: FakeServer, raw: bytes) -> None:
    async with httpx.AsyncClient(base_url=fake_server.url, timeout=30) as http:
        r = await http.post(
            "/v1/responses", content=raw, headers={"Content-Type": "application/json"}
        )
    assert_openai_error(r, 400, "invalid_json")
    await an_ordinary_request_completes(fake_server)


async def test_deeply_nested_json_is_a_400_not_a_crash(fake_server: FakeServer) -> None:
    deep_object: Any = "x"
    for _ in range(100):
        deep_object = {"k": deep_object}
    bodies = [
        b"[" * 50_000 + b"]" * 50_000,
        b'{"model": "fake-model", "input": "hi", "metadata": ' + b"[" * 50_000,
        json.dumps({"model": "fake-model", "input": "hi", "text": deep_object}).encode(),
    ]
    async with httpx.AsyncClient(base_url=fake_server.url, timeout=30) as http:
        for raw in bodies:
            r = await http.post(
                "/v1/responses", content=raw, headers={"Content-Type": "application/json"}
            )
            assert_openai_error(r, 400, "invalid_json")
    await an_ordinary_request_completes(fake_server)


async def test_a_lone_surrogate_is_a_400_and_a_pair_is_text(fake_server: FakeServer) -> None:
    lone = b'{"model": "fake-model", "input": "hi", "stream": true, "instructions": "\\ud800"}'
    in_key = b'{"model": "fake-model", "input": "hi", "metadata": {"\\udfff": "x"}}'
    pair = b'{"model": "fake-model", "input": "echo: \\ud83d\\ude00"}'
    async with httpx.AsyncClient(base_url=fake_server.url, timeout=30) as http:
        for raw in (lone, in_key):
            r = await http.post(
                "/v1/responses", content=raw, headers={"Content-Type": "application/json"}
            )
            assert_openai_error(r, 400, "invalid_json")
        ok = await http.post(
            "/v1/responses", content=pair, headers={"Content-Type": "application/json"}
        )
    assert ok.status_code == 200, ok.text
    assert "\U0001f600" in ok.json()["output"][0]["content"][0]["text"]
    await an_ordinary_request_completes(fake_server)


async def test_a_malformed_or_non_ascii_api_key_is_a_401(
    start_fake_server: StartServer,
) -> None:
    server = await start_fake_server(api_keys=("sk-right",))
    body = {"model": "fake-model", "input": "hi"}
    async with httpx.AsyncClient(base_url=server.url, timeout=30) as http:
        for value in ("Bearer é".encode("latin-1"), b"Bearer \xff\xfe", b"Bearer", b"sk-right"):
            r = await http.post("/v1/responses", json=body, headers={"Authorization": value})
            assert_openai_error(r, 401, "invalid_api_key")
        r = await http.post("/v1/responses", json=body)
        assert_openai_error(r, 401, "invalid_api_key")
        ok = await http.post(
            "/v1/responses", json=body, headers={"Authorization": "Bearer sk-right"}
        )
        assert ok.status_code == 200, ok.text
        assert (await http.get("/health")).status_code == 200


async def test_only_json_bodies_are_accepted(fake_server: FakeServer) -> None:
    raw = json.dumps({"model": "fake-model", "input": "echo: typed"}).encode()
    async with httpx.AsyncClient(base_url=fake_server.url, timeout=30) as http:
        for content_type in ("text/plain", "application/x-www-form-urlencoded", None):
            headers = {"Content-Type": content_type} if content_type else {}
            r = await http.post("/v1/responses", content=raw, headers=headers)
            assert_openai_error(r, 415, "unsupported_media_type")
        r = await http.post(
            "/v1/conversations", content=b"{}", headers={"Content-Type": "text/plain"}
        )
        assert_openai_error(r, 415, "unsupported_media_type")
        for content_type in ("application/json; charset=utf-8", "application/vnd.api+json"):
            r = await http.post(
                "/v1/responses", content=raw, headers={"Content-Type": content_type}
            )
            assert r.status_code == 200, r.text
        # A body-less POST needs no content type.
        created = await http.post("/v1/conversations")
        assert created.status_code == 200, created.text
