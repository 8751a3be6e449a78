"""`DELETE /v1/responses/{id}` of a background response takes its event log with it, on
every store backend: its resume answers 404, the backend holds none of its frames (the
SQLite file's tables, the Redis keys, the memory log table through `/metrics`), and the
other responses' logs stay whole (fake engine, real HTTP)."""

from __future__ import annotations

import re
import sqlite3

import httpx
import openai
import pytest
from resume_support import background, events_of, frames

from mlxcel.model.fake import FakeEngine
from mlxcel.store.limits import sqlite_path

from redis_server import RedisServer
from support import LONG, FakeServer, StartServer, an_ordinary_request_completes, in_thread

SECRET = "the launch code is seven"


@pytest.fixture(params=["memory", "sqlite", "redis"])
def fake_store(request: pytest.FixtureRequest) -> str:
    """Every test here runs on every store backend."""
    return str(request.param)


async def logs_in_metrics(server: FakeServer) -> tuple[int, int]:
    """The event logs `/metrics` counts (`mlxcel_store_*{table="events"}`): logs, bytes."""
    async with httpx.AsyncClient(base_url=server.url, timeout=30) as http:
        text = (await http.get("/metrics")).text
    found = [
        re.search(rf'^mlxcel_store_{name}\{{table="events"\}} (\S+)$', text, re.MULTILINE)
        for name in ("entries", "bytes")
    ]
    assert found[0] is not None
    assert found[1] is not None
    return int(float(found[0].group(1))), int(float(found[1].group(1)))


def frames_kept(
    server: FakeServer, store: str, response_id: str, request: pytest.FixtureRequest
) -> int:
    """What the backend itself holds of the log of `response_id`, read beside the server:
    its frames and its own row (SQLite) or hash (Redis); 0 when nothing is left. The
    memory store has nothing to read from outside: `/metrics` counts its logs."""
    if store == "sqlite":
        path = sqlite_path(server.settings.store)
        assert path is not None
        with sqlite3.connect(f"file:{path}?mode=ro", uri=True) as db:
            (rows,) = db.execute(
                "SELECT count(*) FROM event_frames WHERE response_id = ?", (response_id,)
            ).fetchone()
            (logs,) = db.execute(
                "SELECT count(*) FROM event_logs WHERE response_id = ?", (response_id,)
            ).fetchone()
        db.close()
        return int(rows) + int(logs)
    assert store == "redis"
    redis: RedisServer = request.getfixturevalue("redis_server")
    base = "{" + server.settings.redis_key_prefix + "}:"
    stream = redis.call("XLEN", f"{base}evs:{response_id}")
    meta = redis.call("EXISTS", f"{base}evm:{response_id}")
    assert isinstance(stream, int)
    assert isinstance(meta, int)
    return stream + meta


async def test_a_deleted_responses_log_is_gone_and_the_others_stay(
    start_fake_server: StartServer, fake_store: str, request: pytest.FixtureRequest
) -> None:
    server = await start_fake_server()
    gone = await background(server, SECRET)
    kept = await background(server, "nothing to hide")
    gone_log = frames(await events_of(server, gone))  # both ended: their logs are whole
    kept_log = frames(await events_of(server, kept))
    assert SECRET.encode() in b"".join(gone_log)
    assert await logs_in_metrics(server) == (2, sum(map(len, gone_log + kept_log)))
    if fake_store != "memory":
        assert frames_kept(server, fake_store, gone, request) > len(gone_log)

    async with httpx.AsyncClient(base_url=server.url, timeout=30) as http:
        r = await http.delete(f"/v1/responses/{gone}")
    assert r.status_code == 200, r.text
    assert r.json() == {"id": gone, "object": "response.deleted", "deleted": True}
    with pytest.raises(openai.NotFoundError):
        await in_thread(lambda: list(server.client().responses.retrieve(gone, stream=True)))
    async with httpx.AsyncClient(base_url=server.url, timeout=30) as http:
        r = await http.get(f"/v1/responses/{gone}", params={"stream": "true"})
    assert r.status_code == 404
    assert set(r.json()["error"]) == {"message", "type", "param", "code"}

    assert await logs_in_metrics(server) == (1, sum(map(len, kept_log)))
    if fake_store != "memory":
        assert frames_kept(server, fake_store, gone, request) == 0
        assert frames_kept(server, fake_store, kept, request) == len(kept_log) + 1
    assert frames(await events_of(server, kept)) == kept_log  # untouched, byte for byte
    await an_ordinary_request_completes(server)


async def test_an_unfinished_response_is_refused_then_deleted_with_its_log_once_cancelled(
    start_fake_server: StartServer, fake_store: str, request: pytest.FixtureRequest
) -> None:
    engine = FakeEngine(step_delay=0.002)
    engine.hold("w0")
    server = await start_fake_server(engine)
    running = await background(server, LONG.removeprefix("echo: "))
    assert (await logs_in_metrics(server))[0] == 1  # begun before the create answered
    with pytest.raises(openai.BadRequestError) as caught:
        await in_thread(server.client().responses.delete, running)
    assert caught.value.code == "response_not_finished"
    assert (await logs_in_metrics(server))[0] == 1  # the refused delete kept everything

    cancelled = await in_thread(server.client().responses.cancel, running)
    assert cancelled.status == "cancelled"
    ended = frames(await events_of(server, running))
    assert ended[-1].startswith(b"event: response.failed")  # the log ended with the cancel
    await in_thread(server.client().responses.delete, running)
    assert await logs_in_metrics(server) == (0, 0)
    if fake_store != "memory":
        assert frames_kept(server, fake_store, running, request) == 0
    engine.release()
    await an_ordinary_request_completes(server)
