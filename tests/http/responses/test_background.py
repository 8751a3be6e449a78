"""Background responses over real HTTP with the `openai` SDK (fake engine)."""

from __future__ import annotations

from typing import Any

import httpx
import openai
import pytest
import trio
from openai.types.responses import Response

from mlxcel.config import StoreLimits
from mlxcel.model.fake import FakeEngine

from support import LONG, FakeServer, StartServer, in_thread, wait_until

TERMINAL = ("completed", "incomplete", "failed", "cancelled")


async def poll(server: FakeServer, response_id: str) -> Response:
    client = server.client()
    with trio.fail_after(20):
        while True:
            resp: Response = await in_thread(client.responses.retrieve, response_id)
            if resp.status in TERMINAL:
                return resp
            await trio.sleep(0.02)


@pytest.fixture(params=["memory", "sqlite", "redis"])
def fake_store(request: pytest.FixtureRequest) -> str:
    """Every test here runs on every store backend."""
    return str(request.param)


async def test_background_job_is_queued_then_polled_to_the_end(fake_server: FakeServer) -> None:
    client = fake_server.client()
    queued = await in_thread(
        client.responses.create,
        model="fake-model",
        input="echo: in the background",
        background=True,
    )
    assert queued.status in ("queued", "in_progress")
    assert queued.background is True
    assert queued.output == []
    assert queued.usage is not None
    assert queued.usage.total_tokens == 0
    final = await poll(fake_server, queued.id)
    assert final.status == "completed"
    assert final.background is True
    assert final.output_text == "in the background"
    sync = await in_thread(
        client.responses.create, model="fake-model", input="echo: in the background"
    )
    assert sync.background is False  # every object says which it is
    assert final.usage == sync.usage
    assert final.output[0].content == sync.output[0].content  # type: ignore[union-attr]


@pytest.mark.parametrize(
    ("settings", "extra"),
    [
        ({}, {"stream": True}),
        ({"responses": StoreLimits(0, 1 << 20, 0)}, {}),
        ({"responses": StoreLimits(10, 0, 0)}, {}),
        ({"background_max_jobs": 0}, {}),
    ],
)
async def test_background_refusals_are_400(
    start_fake_server: StartServer, settings: dict[str, Any], extra: dict[str, Any]
) -> None:
    server = await start_fake_server(**settings)
    async with httpx.AsyncClient(base_url=server.url, timeout=30) as http:
        r = await http.post(
            "/v1/responses", json={"model": "fake-model", "input": "x", "background": True, **extra}
        )
    assert r.status_code == 400, r.text
    assert r.json()["error"]["type"] == "invalid_request_error"


async def test_job_cap_answers_429_until_a_job_ends(start_fake_server: StartServer) -> None:
    engine = FakeEngine()
    engine.hold()  # both jobs stay unfinished until released
    server = await start_fake_server(engine, parallel=1, background_max_jobs=2)
    client = server.client()
    first = await in_thread(
        client.responses.create,
        model="fake-model",
        input=LONG,
        background=True,
        max_output_tokens=20,
    )
    await in_thread(
        client.responses.create,
        model="fake-model",
        input=LONG,
        background=True,
        max_output_tokens=20,
    )
    async with httpx.AsyncClient(base_url=server.url, timeout=30) as http:
        r = await http.post(
            "/v1/responses", json={"model": "fake-model", "input": "x", "background": True}
        )
    assert r.status_code == 429
    assert r.json()["error"]["code"] == "rate_limit_exceeded"
    assert r.headers["retry-after"] == "1"
    engine.release()
    await poll(server, first.id)
    with trio.fail_after(20):
        while True:  # the second job may still hold the cap for a moment
            try:
                third = await in_thread(
                    client.responses.create,
                    model="fake-model",
                    input="echo: three",
                    background=True,
                )
                break
            except openai.RateLimitError:
                await trio.sleep(0.05)
    assert (await poll(server, third.id)).output_text == "three"


async def test_byte_budget_of_active_jobs_answers_429(start_fake_server: StartServer) -> None:
    engine = FakeEngine()
    engine.hold()  # the first job stays active
    server = await start_fake_server(engine, parallel=1, responses=StoreLimits(100, 12_000, 0))
    client = server.client()
    await in_thread(
        client.responses.create,
        model="fake-model",
        input=LONG,
        background=True,
        max_output_tokens=1000,
    )  # ~8 kB of room for output
    with pytest.raises(openai.RateLimitError):
        await in_thread(
            client.responses.create,
            model="fake-model",
            input=LONG,
            background=True,
            max_output_tokens=1000,
        )


async def test_cancel_queued_and_running_jobs(start_fake_server: StartServer) -> None:
    engine = FakeEngine()
    engine.hold()  # the running job stays running, the queued one queued
    server = await start_fake_server(engine, parallel=1)
    client = server.client()
    running = await in_thread(
        client.responses.create,
        model="fake-model",
        input=LONG,
        background=True,
        max_output_tokens=300,
    )
    queued = await in_thread(
        client.responses.create,
        model="fake-model",
        input=LONG,
        background=True,
        max_output_tokens=300,
    )
    with trio.fail_after(5):
        await wait_until(lambda: engine.active == 1 and engine.steps > 2)
    assert (await in_thread(client.responses.retrieve, queued.id)).status == "queued"
    assert (await in_thread(client.responses.retrieve, running.id)).status == "in_progress"
    for job in (queued, running):
        cancelled = await in_thread(client.responses.cancel, job.id)
        assert cancelled.status == "cancelled"
        assert cancelled.background is True
    with trio.fail_after(5):
        await wait_until(lambda: engine.active == 0)
    steps = engine.steps
    await trio.sleep(0.1)
    for job in (queued, running):
        assert (await in_thread(client.responses.retrieve, job.id)).status == "cancelled"
    assert engine.steps == steps  # nothing generates any more
    engine.release()
    again = await in_thread(client.responses.cancel, running.id)
    assert again.status == "cancelled"
    after = await in_thread(
        client.responses.create, model="fake-model", input="echo: free", background=True
    )
    assert (await poll(server, after.id)).output_text == "free"  # the slot was freed


async def test_delete_and_chain_wait_for_the_end(start_fake_server: StartServer) -> None:
    engine = FakeEngine()
    engine.hold()  # the job runs until released
    server = await start_fake_server(engine, parallel=1)
    client = server.client()
    job = await in_thread(
        client.responses.create, model="fake-model", input="echo: a b c d e", background=True
    )
    async with httpx.AsyncClient(base_url=server.url, timeout=30) as http:
        r = await http.delete(f"/v1/responses/{job.id}")
        assert r.status_code == 400
        r = await http.post(
            "/v1/responses",
            json={"model": "fake-model", "input": "x", "previous_response_id": job.id},
        )
        assert r.status_code == 400
        assert r.json()["error"]["message"].startswith(
            f"previous response '{job.id}' has not finished (status: "
        )
    engine.release()
    await poll(server, job.id)
    chained = await in_thread(
        client.responses.create, model="fake-model", input="echo: next", previous_response_id=job.id
    )
    assert chained.output_text == "next"
    await in_thread(client.responses.delete, job.id)
    with pytest.raises(openai.NotFoundError):
        await in_thread(client.responses.retrieve, job.id)


async def test_store_false_job_is_pollable_for_the_ephemeral_ttl(
    start_fake_server: StartServer,
) -> None:
    server = await start_fake_server(background_ephemeral_ttl_secs=1)
    client = server.client()
    job = await in_thread(
        client.responses.create,
        model="fake-model",
        input="echo: brief",
        background=True,
        store=False,
    )
    final = await poll(server, job.id)
    assert final.output_text == "brief"
    async with httpx.AsyncClient(base_url=server.url, timeout=30) as http:
        r = await http.post(
            "/v1/responses",
            json={"model": "fake-model", "input": "x", "previous_response_id": job.id},
        )
        assert r.status_code == 400
    await trio.sleep(1.1)  # real time: the fake clock cannot drive a real server
    with pytest.raises(openai.NotFoundError):
        await in_thread(client.responses.retrieve, job.id)


async def test_failed_job_and_conversation_turns(start_fake_server: StartServer) -> None:
    server = await start_fake_server(FakeEngine(fail_on="boom"))
    client = server.client()
    good = await in_thread(
        client.responses.create,
        model="fake-model",
        input="echo: kept",
        background=True,
        conversation="conv_jobs",
    )
    await poll(server, good.id)
    bad = await in_thread(
        client.responses.create,
        model="fake-model",
        input="echo: boom",
        background=True,
        conversation="conv_jobs",
    )
    failed = await poll(server, bad.id)
    assert failed.status == "failed"
    assert failed.error is not None
    assert failed.error.code == "server_error"
    items = await in_thread(client.conversations.items.list, "conv_jobs", order="asc")
    texts = [item.content[0].text for item in items.data]  # type: ignore[union-attr]
    assert texts == ["echo: kept", "kept"]  # the failed job appended nothing


async def test_dropping_the_create_connection_does_not_cancel(
    start_fake_server: StartServer,
) -> None:
    engine = FakeEngine()
    engine.hold()  # the job is still running when its connection closes
    server = await start_fake_server(engine)
    async with httpx.AsyncClient(base_url=server.url, timeout=30) as http:
        r = await http.post(
            "/v1/responses",
            json={
                "model": "fake-model",
                "input": LONG,
                "background": True,
                "max_output_tokens": 40,
            },
        )
        job_id = r.json()["id"]
    # The connection is closed; the job carries on to its end.
    engine.release()
    final = await poll(server, job_id)
    assert final.status == "incomplete"
    assert final.usage is not None
    assert final.usage.output_tokens == 40
