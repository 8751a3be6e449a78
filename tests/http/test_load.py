"""Slots, the waiting queue, disconnects, failures and keep-alives, over real HTTP."""

from __future__ import annotations

import json

import httpx
import trio

from mlxcel.model.fake import FakeEngine

from support import LONG, StartServer, in_thread, queued_becomes, wait_until


class OpenStream:
    """A raw HTTP/1.1 stream, read up to its first text delta and then left unread."""

    def __init__(self, stream: trio.SocketStream) -> None:
        self._stream = stream

    async def aclose(self) -> None:
        await self._stream.aclose()


async def _first_delta(url: str, body: dict[str, object]) -> OpenStream:
    host, port = url.removeprefix("http://").split(":")
    payload = json.dumps({**body, "stream": True}).encode()
    head = (
        f"POST /v1/responses HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(payload)}\r\n\r\n"
    ).encode()
    stream = await trio.open_tcp_stream(host, int(port))
    await stream.send_all(head + payload)
    seen = b""
    while b"response.output_text.delta" not in seen:
        chunk = await stream.receive_some()
        assert chunk, "stream ended before any delta"
        seen += chunk
    assert seen.startswith(b"HTTP/1.1 200")
    return OpenStream(stream)


async def test_full_queue_answers_503(start_fake_server: StartServer) -> None:
    engine = FakeEngine()
    engine.hold(on="w0")  # the long response holds the slot; the others run
    server = await start_fake_server(engine, parallel=1, max_queue_depth=1)
    async with httpx.AsyncClient(base_url=server.url, timeout=30) as http:
        running = await _first_delta(server.url, {"model": "fake-model", "input": LONG})
        async with trio.open_nursery() as nursery:
            waiting = trio.Event()

            async def queued() -> None:
                waiting.set()
                r = await http.post("/v1/responses", json={"model": "fake-model", "input": "hi"})
                assert r.status_code == 200

            nursery.start_soon(queued)
            await waiting.wait()
            await queued_becomes(server.url, 1)  # the queued request reached the queue
            r = await http.post("/v1/responses", json={"model": "fake-model", "input": "hi"})
            assert r.status_code == 503
            error = r.json()["error"]
            assert error["code"] == "server_overloaded"
            assert error["type"] == "server_error"
            await running.aclose()


async def test_disconnect_mid_stream_frees_the_slot(start_fake_server: StartServer) -> None:
    engine = FakeEngine()
    engine.hold(on="w0")  # the long response never runs to its end; the others run
    server = await start_fake_server(engine, parallel=1, max_queue_depth=0)
    async with httpx.AsyncClient(base_url=server.url, timeout=30) as http:
        stream = await _first_delta(server.url, {"model": "fake-model", "input": LONG})
        await stream.aclose()
        with trio.fail_after(5):
            while True:
                r = await http.post("/v1/responses", json={"model": "fake-model", "input": "hi"})
                if r.status_code == 200:
                    break
                assert r.status_code == 503
                await trio.sleep(0.02)
        assert r.json()["status"] == "completed"
    with trio.fail_after(5):  # the model thread drops it at its next step (held, it could
        await wait_until(lambda: engine.active == 0)  # leave no other way)


async def test_engine_failure_is_a_failed_response(start_fake_server: StartServer) -> None:
    server = await start_fake_server(FakeEngine(fail_on="boom"))
    client = server.client()
    resp = await in_thread(client.responses.create, model="fake-model", input="echo: ok boom")
    assert resp.status == "failed"
    assert resp.error is not None
    assert resp.error.code == "server_error"
    assert resp.output == []

    def stream_it() -> list[str]:
        with client.responses.stream(model="fake-model", input="echo: boom") as stream:
            return [event.type for event in stream]

    types = await in_thread(stream_it)
    assert types[-2:] == ["error", "response.failed"]
    async with httpx.AsyncClient(base_url=server.url, timeout=30) as http:
        body = {"model": "fake-model", "input": "echo: boom", "stream": True}
        text = (await http.post("/v1/responses", json=body)).text
    assert "event: error\n" in text
    assert text.rstrip().split("\n\n")[-1].startswith("event: response.failed")
    # The server carries on after a failure.
    after = await in_thread(client.responses.create, model="fake-model", input="echo: fine")
    assert after.output_text == "fine"


async def test_sixteen_concurrent_streams_get_their_own_text(
    start_fake_server: StartServer,
) -> None:
    server = await start_fake_server(FakeEngine(step_delay=0.002), parallel=4)
    client = server.client()
    results: dict[int, tuple[str, str]] = {}

    def one(i: int) -> None:
        deltas = []
        with client.responses.stream(model="fake-model", input=f"echo: word {i} end") as s:
            for event in s:
                if event.type == "response.output_text.delta":
                    deltas.append(event.delta)
            results[i] = ("".join(deltas), s.get_final_response().output_text)

    async with trio.open_nursery() as nursery:
        for i in range(16):
            nursery.start_soon(in_thread, one, i)
    assert results == {i: (f"word {i} end", f"word {i} end") for i in range(16)}


async def test_keepalive_comments_during_a_long_prefill(start_fake_server: StartServer) -> None:
    engine = FakeEngine(step_delay=0.02, prefill_chunk=2)
    server = await start_fake_server(engine, sse_keepalive_secs=0.05, progress_events=False)
    async with httpx.AsyncClient(base_url=server.url, timeout=30) as http:
        body = {"model": "fake-model", "input": "echo: done", "stream": True}
        text = (await http.post("/v1/responses", json=body)).text
    assert ": keep-alive\n\n" in text
    assert "event: response.completed" in text
    assert "mlx.progress" not in text
