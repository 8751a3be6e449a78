"""A killed server's unfinished background job whose stored bytes this release cannot read
(a later encoding version, or damage) never stops the next server: it starts, warns once
naming the job and why (never its bytes), ends the unfinished jobs it can read, answers
the unreadable one as any unreadable stored response (503 `store_unavailable`), and keeps
serving; in the SQLite file and in Redis (fake engine, separate processes)."""

from __future__ import annotations

import contextlib
import json
import sqlite3
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import httpx
import pytest

from mlxcel.store.backend import RESTART_MESSAGE

from redis_server import RedisServer
from server_process import MODEL, ServerProcesses
from support import LONG, key_prefix
from webhook_receiver import SECRET as WEBHOOK_SECRET
from webhook_receiver import receiver, unwrap

SECRET = "kept-words-no-log-shows"
UNREADABLE = {
    "later_version": b'{"v":99,"$":"ResponseRecord","id":"' + SECRET.encode() + b'"}',
    "damaged": b'{"$":"ResponseRecord","v":2,' + SECRET.encode(),
}
"""What an unfinished job's stored bytes are rewritten to: each carries `SECRET`."""
UNREADABLE_DELIVERIES = {
    "later_version": b'{"response_id":"r","event_id":"e","tenant":"","said":"'
    + SECRET.encode()
    + b'"}',
    "damaged": b'{"response_id":"' + SECRET.encode(),
}
"""What a pending webhook delivery's stored bytes are rewritten to."""


class Kept(Protocol):
    """The store's unfinished jobs read and written beside the server."""

    def flags(self) -> tuple[str, ...]: ...

    def rewrite(self, job_id: str, body: bytes) -> None: ...

    def rewrite_delivery(self, response_id: str, body: bytes) -> None: ...

    def wait_lapsed(self) -> None:
        """Until the killed server's jobs are another server's to end (at its start)."""
        ...

    def wait_renewed(self) -> None:
        """Until the running server has looked for jobs to end again since its start."""
        ...


@dataclass
class SqliteFile:
    path: Path

    def flags(self) -> tuple[str, ...]:
        return ("--store", f"sqlite:{self.path}")

    def rewrite(self, job_id: str, body: bytes) -> None:
        with contextlib.closing(sqlite3.connect(self.path)) as db, db:
            done = db.execute(
                "UPDATE entries SET body = ? WHERE tbl = 'active' AND id = ?", (body, job_id)
            )
            assert done.rowcount == 1

    def rewrite_delivery(self, response_id: str, body: bytes) -> None:
        with contextlib.closing(sqlite3.connect(self.path)) as db, db:
            done = db.execute(
                "UPDATE webhook_deliveries SET body = ? WHERE response_id = ?",
                (body.decode(), response_id),
            )
            assert done.rowcount == 1

    def wait_lapsed(self) -> None:
        pass  # one server per file: the next one ends what it finds, at its start

    def wait_renewed(self) -> None:
        pass  # it looks only at its start


@dataclass
class RedisKeys:
    redis: RedisServer
    prefix: str

    def flags(self) -> tuple[str, ...]:
        lease = ("--replica-lease-secs", "1")  # the killed server's lease lapses soon
        return ("--store", self.redis.url, "--redis-key-prefix", self.prefix, *lease)

    def rewrite(self, job_id: str, body: bytes) -> None:
        key = "{" + self.prefix + "}:active:body"
        assert self.redis.call("HSET", key, job_id, body) == 0  # replaced

    def rewrite_delivery(self, response_id: str, body: bytes) -> None:
        key = "{" + self.prefix + "}:webhooks:body"
        assert self.redis.call("HSET", key, response_id, body) == 0  # replaced

    def _leases(self) -> list[bytes]:
        found = self.redis.call("KEYS", "{" + self.prefix + "}:lease:*")
        assert isinstance(found, list)
        return found

    def wait_lapsed(self) -> None:
        deadline = time.monotonic() + 30
        while self._leases():
            assert time.monotonic() < deadline
            time.sleep(0.05)

    def wait_renewed(self) -> None:
        """Two renewals of the one lease: the first one's look for dead jobs is done."""
        (lease,) = self._leases()
        deadline = time.monotonic() + 30
        renewals, last = 0, self._ttl(lease)
        while renewals < 2:
            assert time.monotonic() < deadline
            time.sleep(0.02)
            now = self._ttl(lease)
            renewals, last = renewals + (now > last), now

    def _ttl(self, key: bytes) -> int:
        ms = self.redis.call("PTTL", key)
        assert isinstance(ms, int)
        return ms


@pytest.fixture(params=["sqlite", "redis"])
def kept(request: pytest.FixtureRequest, tmp_path: Path) -> Kept:
    if request.param == "sqlite":
        return SqliteFile(tmp_path / "store.sqlite3")
    redis: RedisServer = request.getfixturevalue("redis_server")
    return RedisKeys(redis, key_prefix())


def _poll(http: httpx.Client, response_id: str, status: str) -> dict[str, Any]:
    deadline = time.monotonic() + 30
    while True:
        body: dict[str, Any] = http.get(f"/v1/responses/{response_id}").json()
        if body["status"] == status:
            return body
        assert time.monotonic() < deadline, body
        time.sleep(0.05)


@pytest.mark.parametrize("body", sorted(UNREADABLE))
def test_an_unreadable_unfinished_job_never_stops_the_next_server(
    servers: ServerProcesses, kept: Kept, body: str
) -> None:
    first = servers.start(*kept.flags(), hold="w0")  # both jobs stay unfinished until killed
    client = first.client()
    unreadable = client.responses.create(model=MODEL, input=LONG, background=True)
    readable = client.responses.create(model=MODEL, input=LONG, background=True)
    with first.http() as http:
        _poll(http, unreadable.id, "in_progress")
    first.kill()
    kept.rewrite(unreadable.id, UNREADABLE[body])
    kept.wait_lapsed()

    second = servers.start(*kept.flags())
    with second.http() as http:
        ended = _poll(http, readable.id, "failed")  # the job it can read, ended as before
        assert ended["error"] == {"code": "server_error", "message": RESTART_MESSAGE}
        kept.wait_renewed()
        r = http.get(f"/v1/responses/{unreadable.id}")
        assert r.status_code == 503, r.text  # as any stored response it cannot read
        error = r.json()["error"]
        assert set(error) == {"message", "type", "param", "code"}
        assert (error["type"], error["code"]) == ("server_error", "store_unavailable")
        assert http.get("/health").status_code == 200
    assert second.client().responses.create(model=MODEL, input="echo: fine").output_text == "fine"

    logged = second.log.read_text()
    warnings = [line for line in logged.splitlines() if unreadable.id in line and "WARNING" in line]
    assert len(warnings) == 1, logged  # once, however often the store is looked at
    assert "cannot be read" in warnings[0], warnings[0]
    assert SECRET not in logged
    assert "Traceback" not in logged


@pytest.mark.parametrize("body", sorted(UNREADABLE))
def test_an_unreadable_response_never_stops_an_item_index_upgrade(
    servers: ServerProcesses, redis_server: RedisServer, body: str
) -> None:
    """A Redis store an earlier release indexed (one list of item ids per response) is
    indexed afresh at start: a response there this release cannot read is left out of the
    index, warned about, and kept; the others are indexed."""
    kept = RedisKeys(redis_server, key_prefix())
    first = servers.start(*kept.flags())
    client = first.client()
    unreadable = client.responses.create(model=MODEL, input="echo: lost words")
    readable = client.responses.create(model=MODEL, input="echo: found words")
    first.kill()
    base = "{" + kept.prefix + "}:"
    for key in redis_server.call("KEYS", base + "ix:*") or []:  # back to the old layout
        redis_server.call("DEL", key)
    redis_server.call("DEL", base + "responses:itemkeys")
    for response in (unreadable, readable):
        ids = json.dumps([response.output[0].id])
        redis_server.call("HSET", base + "responses:itemids", response.id, ids)
    redis_server.call("HSET", base + "responses:body", unreadable.id, UNREADABLE[body])

    second = servers.start(*kept.flags())
    client = second.client()
    with second.http() as http:
        r = http.get(f"/v1/responses/{unreadable.id}")
        assert r.status_code == 503, r.text
        assert r.json()["error"]["code"] == "store_unavailable"
        assert http.get("/health").status_code == 200
    reference = {"type": "item_reference", "id": readable.output[0].id}
    conv = client.conversations.create(items=[reference])  # type: ignore[list-item]
    said = client.conversations.items.list(conv.id).data
    assert [i.content[0].text for i in said] == ["found words"]  # type: ignore[union-attr]
    assert client.responses.create(model=MODEL, input="echo: fine").output_text == "fine"

    logged = second.log.read_text()
    warnings = [line for line in logged.splitlines() if unreadable.id in line and "WARNING" in line]
    assert len(warnings) == 1, logged
    assert "cannot be read" in warnings[0], warnings[0]
    assert SECRET not in logged
    assert "Traceback" not in logged


@pytest.mark.parametrize("body", sorted(UNREADABLE_DELIVERIES))
def test_an_unreadable_webhook_delivery_never_holds_back_the_others(
    servers: ServerProcesses, kept: Kept, body: str
) -> None:
    """A pending delivery this release cannot read, found by the next server, is left as
    stored and warned about; every other delivery is still sent."""
    with receiver([500, 500]) as hook:
        flags = (
            *kept.flags(),
            *("--webhook-url", hook.url, "--webhook-secret", WEBHOOK_SECRET),
            *("--webhook-backoff-secs", "2", "--webhook-timeout-secs", "2"),
        )
        first = servers.start(*flags)
        client = first.client()
        unreadable = client.responses.create(model=MODEL, input="echo: one", background=True)
        readable = client.responses.create(model=MODEL, input="echo: two", background=True)
        hook.wait_for(2)  # each failed once: both pending, due again in 1 to 2 s
        first.kill()
        kept.rewrite_delivery(unreadable.id, UNREADABLE_DELIVERIES[body])

        second = servers.start(*flags)
        sent = unwrap(hook.wait_for(3)[2])
        assert (sent.type, sent.data.id) == ("response.completed", readable.id)
        with second.http() as http:
            assert http.get("/health").status_code == 200
        ordinary = second.client().responses.create(model=MODEL, input="echo: fine")
        assert ordinary.output_text == "fine"

    logged = second.log.read_text()
    warnings = [line for line in logged.splitlines() if unreadable.id in line and "WARNING" in line]
    assert len(warnings) == 1, logged
    assert "cannot be read" in warnings[0], warnings[0]
    assert SECRET not in logged
    assert "Traceback" not in logged
