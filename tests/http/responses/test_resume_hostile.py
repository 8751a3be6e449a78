"""Hostile and unlucky resumers of a background response's stream (`GET
/v1/responses/{id}?stream=true`): other tenants, bad numbers, crowds, a reader that
stops, resumes racing the end, a log past its bounds (fake engine, real HTTP)."""

from __future__ import annotations

import random
import re
import socket
from typing import Any

import httpx
import openai
import pytest
import trio
from resume_support import WORDS, background, events_of, frames

from mlxcel.config import StoreLimits
from mlxcel.model.fake import FakeEngine

from support import (
    LONG,
    FakeServer,
    StartServer,
    an_ordinary_request_completes,
    in_thread,
    read_until,
)

KEYS = ("key-a", "key-b")


@pytest.fixture(params=["memory", "sqlite", "redis"])
def fake_store(request: pytest.FixtureRequest) -> str:
    """Every test here runs on every store backend."""
    return str(request.param)


async def finished(server: FakeServer, response_id: str) -> list[bytes]:
    """The frames of the whole log once the response has ended."""
    return frames(await events_of(server, response_id))


async def refusal(server: FakeServer, path: str, **params: Any) -> tuple[int, dict[str, Any]]:
    async with httpx.AsyncClient(base_url=server.url, timeout=30) as http:
        r = await http.get(path, params=params)
    return r.status_code, r.json()["error"]


async def test_another_tenants_response_is_not_found(start_fake_server: StartServer) -> None:
    server = await start_fake_server(api_keys=KEYS)
    queued = await in_thread(
        server.client(KEYS[0]).responses.create,
        model="fake-model",
        input="echo: mine",
        background=True,
    )

    def resume_as(key: str) -> list[str]:
        with server.client(key).responses.retrieve(queued.id, stream=True) as stream:
            return [event.type for event in stream]

    with pytest.raises(openai.NotFoundError):
        await in_thread(resume_as, KEYS[1])
    types = await in_thread(resume_as, KEYS[0])
    assert types[0] == "response.created"
    assert types[-1] == "response.completed"


@pytest.mark.parametrize(
    ("params", "param"),
    [
        ({"starting_after": "seven"}, "starting_after"),
        ({"starting_after": "-1"}, "starting_after"),
        ({"starting_after": "1.5"}, "starting_after"),
        ({"starting_after": "٣"}, "starting_after"),  # a digit, not an ASCII one
        ({"starting_after": ""}, "starting_after"),
        ({"starting_after": str(10**30)}, "starting_after"),
        ({"starting_after": "9" * 4000}, "starting_after"),
        ({"stream": "maybe"}, "stream"),
        ({"include_obfuscation": "sometimes"}, "include_obfuscation"),
    ],
)
async def test_bad_numbers_and_flags_are_400_naming_the_parameter(
    fake_server: FakeServer, params: dict[str, str], param: str
) -> None:
    response_id = await background(fake_server, "short")
    await finished(fake_server, response_id)
    status, error = await refusal(
        fake_server, f"/v1/responses/{response_id}", **{"stream": "true", **params}
    )
    assert status == 400, error
    assert error["param"] == param
    assert error["type"] == "invalid_request_error"
    await an_ordinary_request_completes(fake_server)


async def test_a_number_past_the_last_event_of_a_finished_response_is_400(
    fake_server: FakeServer,
) -> None:
    response_id = await background(fake_server, "short")
    log = await finished(fake_server, response_id)
    last = len(log) - 1
    assert frames(await events_of(fake_server, response_id, starting_after=last - 1)) == log[-1:]
    assert await events_of(fake_server, response_id, starting_after=last) == b""  # all seen
    status, error = await refusal(
        fake_server, f"/v1/responses/{response_id}", stream="true", starting_after=str(last + 1)
    )
    assert status == 400, error
    assert error["param"] == "starting_after"
    assert str(last) in error["message"]


async def test_a_response_not_made_in_the_background_is_400(fake_server: FakeServer) -> None:
    sync = await in_thread(
        fake_server.client().responses.create, model="fake-model", input="echo: now"
    )
    with pytest.raises(openai.BadRequestError) as caught:
        await in_thread(fake_server.client().responses.retrieve, sync.id, stream=True)
    assert caught.value.body["param"] == "stream"  # type: ignore[index]
    # stream=false, and no stream at all, are the JSON object.
    plain = await in_thread(fake_server.client().responses.retrieve, sync.id, stream=False)
    assert plain.id == sync.id


async def test_obfuscation_is_accepted_and_the_replay_stays_the_same(
    fake_server: FakeServer,
) -> None:
    response_id = await background(fake_server)
    log = await finished(fake_server, response_id)
    for value in ("true", "false"):
        again = await events_of(fake_server, response_id, include_obfuscation=value)
        assert frames(again) == log
    assert b"obfuscation" not in b"".join(log)


async def test_a_queued_job_first_gets_queued_then_runs_to_its_end(
    start_fake_server: StartServer,
) -> None:
    engine = FakeEngine(step_delay=0.002)
    engine.hold("w0")
    server = await start_fake_server(engine, parallel=1)
    first = await background(server, LONG.removeprefix("echo: "))  # holds the only slot
    waiting = await background(server, "after the first")
    seen: list[str] = []

    def follow() -> None:
        with server.client().responses.retrieve(waiting, stream=True) as stream:
            for event in stream:
                seen.append(event.type)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(in_thread, follow)
        with trio.fail_after(10):
            while len(seen) < 2:  # noqa: ASYNC110 - filled by the SDK's thread
                await trio.sleep(0.01)
        await trio.sleep(0.2)
        assert seen == ["response.created", "response.queued"]  # nothing more while queued
        engine.release()
    assert seen[2] == "response.in_progress"
    assert seen[-1] == "response.completed"
    assert (await finished(server, first))[-1].startswith(b"event: response.completed")


async def test_a_hundred_resumers_of_one_running_response_read_the_same_bytes(
    start_fake_server: StartServer,
) -> None:
    server = await start_fake_server(FakeEngine(step_delay=0.01))
    response_id = await background(server)
    bodies: list[bytes] = []
    limits = httpx.Limits(max_connections=200)

    async def resume(http: httpx.AsyncClient, after: int) -> None:
        r = await http.get(
            f"/v1/responses/{response_id}",
            params={"stream": "true", "starting_after": str(after)},
        )
        assert r.status_code == 200, r.text
        bodies.append(r.content)

    http = httpx.AsyncClient(base_url=server.url, timeout=60, limits=limits)
    async with http, trio.open_nursery() as nursery:
        for _ in range(100):
            nursery.start_soon(resume, http, 1)
    log = await finished(server, response_id)
    assert len(bodies) == 100
    assert all(frames(body) == log[2:] for body in bodies)
    assert b"response.completed" in log[-1]
    await an_ordinary_request_completes(server)


async def test_resumes_racing_the_end_each_get_the_rest_whole(
    start_fake_server: StartServer,
) -> None:
    server = await start_fake_server(FakeEngine(step_delay=0.005))
    response_id = await background(server)
    results: list[tuple[int, bytes]] = []
    rng = random.Random(30)

    async def resume_later(http: httpx.AsyncClient, delay: float) -> None:
        await trio.sleep(delay)
        r = await http.get(
            f"/v1/responses/{response_id}", params={"stream": "true", "starting_after": "1"}
        )
        assert r.status_code == 200, r.text
        results.append((1, r.content))

    http = httpx.AsyncClient(base_url=server.url, timeout=60)
    async with http, trio.open_nursery() as nursery:
        for _ in range(30):  # around the end: 40 words at 5 ms a step
            nursery.start_soon(resume_later, http, rng.uniform(0.05, 0.6))
    log = await finished(server, response_id)
    assert all(frames(body) == log[after + 1 :] for after, body in results)
    retrieved = await in_thread(server.client().responses.retrieve, response_id)
    assert retrieved.output_text == WORDS


async def test_a_resumer_that_stops_reading_holds_nothing(start_fake_server: StartServer) -> None:
    word = "x" * 100_000  # frames far larger than the socket buffers
    server = await start_fake_server(
        FakeEngine(step_delay=0.002), parallel=1, max_queue_depth=0, context_length=8_000_000
    )
    response_id = await background(server, " ".join([word] * 20))
    host, port = server.url.removeprefix("http://").split(":")
    sock = trio.socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    await sock.connect((host, int(port)))
    stalled = trio.SocketStream(sock)
    path = f"/v1/responses/{response_id}?stream=true"
    await stalled.send_all(f"GET {path} HTTP/1.1\r\nHost: {host}\r\n\r\n".encode())
    await read_until(stalled, b"event: ")  # then it reads no more
    with trio.fail_after(30):  # the job ends, others resume it, the slot serves others
        log = await finished(server, response_id)
    assert log[-1].startswith(b"event: response.completed")
    await an_ordinary_request_completes(server)
    await stalled.aclose()


async def test_a_log_past_its_event_cap_is_refused_clearly(start_fake_server: StartServer) -> None:
    server = await start_fake_server(max_events_per_response=16)
    response_id = await background(server)  # 40 words: far more than 16 events
    retrieved = await in_thread(server.client().responses.retrieve, response_id)
    with trio.fail_after(20):
        while retrieved.status != "completed":
            await trio.sleep(0.02)
            retrieved = await in_thread(server.client().responses.retrieve, response_id)
    status, error = await refusal(server, f"/v1/responses/{response_id}", stream="true")
    assert status == 400, error
    assert error["code"] == "event_log_truncated"
    assert "--max-events-per-response" in error["message"]
    short = await background(server, "two words")  # within the cap: kept whole
    assert frames(await events_of(server, short))[-1].startswith(b"event: response.completed")


async def test_after_the_responses_retention_a_resume_is_404(
    start_fake_server: StartServer,
) -> None:
    server = await start_fake_server(responses=StoreLimits(1024, 1 << 28, 1))
    response_id = await background(server, "soon gone")
    assert frames(await events_of(server, response_id))  # kept while the response is
    await trio.sleep(1.5)
    status, error = await refusal(server, f"/v1/responses/{response_id}", stream="true")
    assert status == 404, error
    await an_ordinary_request_completes(server)


async def test_metrics_count_resumes(fake_server: FakeServer) -> None:
    response_id = await background(fake_server, "counted")
    for _ in range(3):
        await finished(fake_server, response_id)
    async with httpx.AsyncClient(base_url=fake_server.url, timeout=30) as http:
        text = (await http.get("/metrics")).text
    assert "mlxcel_response_resumes_total 3.0" in text
    logged = re.search(r'^mlxcel_store_bytes\{table="events"\} (\S+)$', text, re.MULTILINE)
    assert logged is not None
    assert float(logged.group(1)) == sum(len(f) for f in await finished(fake_server, response_id))


async def test_a_reader_of_a_log_cut_short_gets_an_error_event(
    start_fake_server: StartServer,
) -> None:
    server = await start_fake_server(FakeEngine(step_delay=0.05), max_events_per_response=16)
    response_id = await background(server)

    def follow() -> list[Any]:
        with server.client().responses.retrieve(response_id, stream=True) as stream:
            return list(stream)

    events = await in_thread(follow)
    assert [e.sequence_number for e in events[:-1]] == list(range(len(events) - 1))
    assert events[-1].type == "error"
    assert events[-1].code == "event_log_truncated"
    await an_ordinary_request_completes(server)


async def test_a_cancel_ends_a_followed_stream_with_the_cancelled_object(
    start_fake_server: StartServer,
) -> None:
    engine = FakeEngine(step_delay=0.002)
    engine.hold("w0")
    server = await start_fake_server(engine)
    response_id = await background(server, LONG.removeprefix("echo: "))
    seen: list[Any] = []

    def follow() -> None:
        with server.client().responses.retrieve(response_id, stream=True) as stream:
            seen.extend(stream)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(in_thread, follow)
        with trio.fail_after(10):
            while not any(e.type == "response.output_text.delta" for e in seen):  # noqa: ASYNC110
                await trio.sleep(0.01)
        cancelled = await in_thread(server.client().responses.cancel, response_id)
    assert cancelled.status == "cancelled"
    assert seen[-1].type == "response.failed"
    assert seen[-1].response.model_dump() == cancelled.model_dump()
    engine.release()
