"""Unlucky clients over real HTTP: hang-ups, stalled readers, cancels racing the end,
requesters that leave the queue. After each, the server answers and a slot is free."""

from __future__ import annotations

import httpx
import pytest
import trio

from mlxcel.model.fake import FakeEngine

from support import (
    LONG,
    StartServer,
    an_ordinary_request_completes,
    in_thread,
    queued_becomes,
    raw_request,
    read_until,
)


@pytest.fixture(params=["memory", "sqlite", "redis"])
def fake_store(request: pytest.FixtureRequest) -> str:
    """Every test here runs on every store backend: a requester that leaves never keeps
    a store write from finishing."""
    return str(request.param)


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


async def test_a_reader_that_stops_reading_frees_its_slot_once_its_sequence_ends(
    start_fake_server: StartServer,
) -> None:
    """Its events wait for it in its own stream; the slot does not (with `--parallel 1`,
    a reader at 31 KB/s used to get everyone else 503 for the whole delivery)."""
    # Six 1 MB words: more than the kernel buffers between the server and a client
    # whose receive window is tiny, so the server's writes block.
    word = "x" * 1_000_000
    engine = FakeEngine()
    server = await start_fake_server(
        engine, parallel=1, max_queue_depth=0, send_timeout_secs=30, context_length=8_000_000
    )
    body = {
        "model": "fake-model",
        "input": "echo: " + " ".join([word] * 6),
        "stream": True,
        "store": True,
    }
    stalled = await raw_request(server.url, body, rcvbuf=4096)
    try:
        seen = await read_until(stalled, b"response.created")
        response_id = seen.split(b'"id":"', 1)[1].split(b'"', 1)[0].decode()
        # The stalled client reads nothing more, and the one slot serves the next
        # request well within the send deadline: it was freed when the sequence ended.
        await an_ordinary_request_completes(server, within=15)
        client = server.client()
        with trio.fail_after(10):
            stored = await in_thread(client.responses.retrieve, response_id)
        assert stored.status == "completed"
        assert stored.output_text == " ".join([word] * 6)
    finally:
        await stalled.aclose()


async def test_a_queued_requester_that_leaves_leaves_the_line(
    start_fake_server: StartServer,
) -> None:
    engine = FakeEngine()
    engine.hold(on="w0")  # the long response holds the one slot; the others run
    server = await start_fake_server(engine, parallel=1, max_queue_depth=1)
    running = await raw_request(server.url, {"model": "fake-model", "input": LONG, "stream": True})
    await read_until(running, b"response.output_text.delta")
    # A synchronous request takes the one queue place, then its client gives up.
    queued = await raw_request(server.url, {"model": "fake-model", "input": "echo: q"})
    await queued_becomes(server.url, 1)
    await queued.aclose()
    await queued_becomes(server.url, 0)
    # Its place is free at once: a newcomer is queued, not refused.
    body = {"model": "fake-model", "input": "echo: next", "stream": True}
    async with (
        httpx.AsyncClient(base_url=server.url, timeout=30) as http,
        http.stream("POST", "/v1/responses", json=body) as r,
    ):
        assert r.status_code == 200
    await running.aclose()
    await an_ordinary_request_completes(server)


async def test_a_queued_stream_that_hangs_up_is_stored_cancelled(
    start_fake_server: StartServer,
) -> None:
    """The client saw the id in `response.created`: the response is kept, as a running
    one that loses its client is."""
    engine = FakeEngine()
    engine.hold(on="w0")  # the long response holds the one slot; the others run
    server = await start_fake_server(engine, parallel=1)
    running = await raw_request(server.url, {"model": "fake-model", "input": LONG, "stream": True})
    await read_until(running, b"response.output_text.delta")
    queued = await raw_request(server.url, {"model": "fake-model", "input": "hi", "stream": True})
    created = await read_until(queued, b"response.created")
    response_id = created.split(b'"id":"', 1)[1].split(b'"', 1)[0].decode()
    await queued.aclose()
    async with httpx.AsyncClient(base_url=server.url, timeout=30) as http:
        with trio.fail_after(10):
            while (r := await http.get(f"/v1/responses/{response_id}")).status_code == 404:  # noqa: ASYNC110 - the server is polled over HTTP
                await trio.sleep(0.01)
        assert r.json()["status"] == "cancelled"
        assert (await http.get("/health")).json()["slots"]["queued"] == 0
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
