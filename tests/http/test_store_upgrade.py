"""What the previous release stored (encoding version 1: `store` and `background` in a
record's echo) after an upgrade, in the SQLite file and in Redis: each response reads as
it did, continues, resumes its events and deletes; the job it left unfinished is ended
into the table its flags choose (fake engine, separate processes)."""

from __future__ import annotations

import contextlib
import json
import sqlite3
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import httpx
import openai
import pytest
from resume_support import frames

from mlxcel.store.backend import RESTART_MESSAGE

from redis_server import RedisServer
from server_process import MODEL, ServerProcesses
from store_versions import as_version_1
from support import LONG, key_prefix

TABLES = ("responses", "ephemeral", "active", "conversations")


class Kept(Protocol):
    """A store's values read and written beside the server, as an upgrade finds them."""

    def flags(self) -> tuple[str, ...]: ...

    def bodies(self) -> dict[str, tuple[str, bytes]]:
        """Each value's id: its table and its encoding."""
        ...

    def rewrite(self, table: str, value_id: str, body: bytes) -> None: ...


@dataclass
class SqliteFile:
    path: Path

    def flags(self) -> tuple[str, ...]:
        return ("--store", f"sqlite:{self.path}")

    def bodies(self) -> dict[str, tuple[str, bytes]]:
        with contextlib.closing(sqlite3.connect(self.path)) as db:
            marks = ", ".join("?" * len(TABLES))
            rows = db.execute(f"SELECT id, tbl, body FROM entries WHERE tbl IN ({marks})", TABLES)
            return {rid: (table, bytes(body)) for rid, table, body in rows}

    def rewrite(self, table: str, value_id: str, body: bytes) -> None:
        with contextlib.closing(sqlite3.connect(self.path)) as db, db:
            db.execute(
                "UPDATE entries SET body = ? WHERE tbl = ? AND id = ?", (body, table, value_id)
            )


@dataclass
class RedisKeys:
    redis: RedisServer
    prefix: str

    def flags(self) -> tuple[str, ...]:
        # A short lease: the killed server's job is ended soon after the next one starts.
        lease = ("--replica-lease-secs", "1")
        return ("--store", self.redis.url, "--redis-key-prefix", self.prefix, *lease)

    def _key(self, table: str) -> str:
        return "{" + self.prefix + "}:" + f"{table}:body"

    def bodies(self) -> dict[str, tuple[str, bytes]]:
        found = {}
        for table in TABLES:
            flat = self.redis.call("HGETALL", self._key(table))
            assert isinstance(flat, list)
            for n in range(0, len(flat), 2):
                value_id, body = flat[n], flat[n + 1]
                assert isinstance(value_id, bytes)
                assert isinstance(body, bytes)
                found[value_id.decode()] = (table, body)
        return found

    def rewrite(self, table: str, value_id: str, body: bytes) -> None:
        assert self.redis.call("HSET", self._key(table), value_id, body) == 0  # replaced


@pytest.fixture(params=["sqlite", "redis"])
def kept(request: pytest.FixtureRequest, tmp_path: Path) -> Kept:
    if request.param == "sqlite":
        return SqliteFile(tmp_path / "store.sqlite3")
    redis: RedisServer = request.getfixturevalue("redis_server")
    return RedisKeys(redis, key_prefix())


def _get(http: httpx.Client, path: str) -> bytes:
    r = http.get(path)
    assert r.status_code == 200, (path, r.status_code, r.text)
    return r.content


def _poll(http: httpx.Client, response_id: str, status: str) -> dict[str, Any]:
    deadline = time.monotonic() + 30
    while True:
        body: dict[str, Any] = http.get(f"/v1/responses/{response_id}").json()
        if body["status"] == status:
            return body
        assert time.monotonic() < deadline, body
        time.sleep(0.05)


def _downgrade(kept: Kept) -> dict[str, str]:
    """Every value the server wrote, rewritten as the previous release wrote it; the
    table each is in."""
    tables = {}
    for value_id, (table, body) in kept.bodies().items():
        old = as_version_1(body)
        assert len(old) == len(body)  # the byte budgets the store counted stay right
        kept.rewrite(table, value_id, old)
        tables[value_id] = table
    return tables


def test_what_the_previous_release_stored_reads_continues_resumes_and_deletes(
    servers: ServerProcesses, kept: Kept
) -> None:
    first = servers.start(*kept.flags(), hold="w0")  # the long job stays in flight until killed
    client = first.client()
    conv = client.conversations.create(items=[{"role": "user", "content": "echo: before"}])
    stored = client.responses.create(model=MODEL, input="echo: kept")
    quiet = client.responses.create(
        model=MODEL, input="echo: kept a while", background=True, store=False
    )
    job = client.responses.create(model=MODEL, input="echo: in the log", background=True)
    with first.http() as http:
        _poll(http, quiet.id, "completed")
        _poll(http, job.id, "completed")
        running = client.responses.create(model=MODEL, input=LONG, background=True, store=False)
        _poll(http, running.id, "in_progress")
        paths = [f"/v1/responses/{r.id}" for r in (stored, quiet, job)]
        paths += [f"/v1/responses/{r.id}/input_items" for r in (stored, job)]
        paths += [f"/v1/responses/{r.id}?stream=true" for r in (quiet, job)]
        paths += [f"/v1/conversations/{conv.id}/items"]
        before = {path: _get(http, path) for path in paths}
    first.kill()

    tables = _downgrade(kept)
    assert tables == {
        conv.id: "conversations",
        stored.id: "responses",
        quiet.id: "ephemeral",
        job.id: "responses",
        running.id: "active",
    }
    old = json.loads(kept.bodies()[running.id][1])
    assert old["v"] == 1
    assert (old["echo"]["store"], old["echo"]["background"]) == (False, True)

    second = servers.start(*kept.flags())
    with second.http() as http:
        ended = _poll(http, running.id, "failed")  # the unfinished job, ended by the restart
        assert ended["error"] == {"code": "server_error", "message": RESTART_MESSAGE}
        assert (ended["store"], ended.get("background")) == (False, True)
        log = frames(_get(http, f"/v1/responses/{running.id}?stream=true"))
        assert log[-1].startswith(b"event: response.failed")
        assert {path: _get(http, path) for path in paths} == before  # byte for byte
        r = http.get(f"/v1/responses/{stored.id}", params={"stream": "true"})
        assert r.status_code == 400, r.text  # not a background response: no events kept
        assert r.json()["error"]["param"] == "stream"
    assert {i: t for i, (t, _) in kept.bodies().items()} == {
        **tables,
        running.id: "ephemeral",  # `store: false`: where its final object belongs
    }
    _continue_and_delete(second.client(), stored.id, job.id, (quiet.id, running.id), conv.id)
    with second.http() as http:
        assert http.get("/health").status_code == 200
    assert second.client().responses.create(model=MODEL, input="echo: fine").output_text == "fine"


def _continue_and_delete(
    client: openai.OpenAI, stored: str, job: str, ephemeral: tuple[str, ...], conv: str
) -> None:
    """Each old response continues with its history, then deletes; the old conversation
    takes a turn."""
    alone = client.responses.input_tokens.count(model=MODEL, input="echo: more").input_tokens
    for previous in (stored, job):
        chained = client.responses.input_tokens.count(
            model=MODEL, input="echo: more", previous_response_id=previous
        ).input_tokens
        assert chained > alone  # the old turn is in the prompt
        more = client.responses.create(
            model=MODEL, input="echo: more", previous_response_id=previous
        )
        assert (more.output_text, more.previous_response_id) == ("more", previous)
    turn = client.responses.create(model=MODEL, input="echo: after", conversation=conv)
    assert turn.output_text == "after"
    said = client.conversations.items.list(conv, order="asc").data
    texts = [i.content[0].text for i in said]  # type: ignore[union-attr]
    assert texts == ["echo: before", "echo: after", "after"]
    for response_id in (stored, job, *ephemeral):
        client.responses.delete(response_id)
        with pytest.raises(openai.NotFoundError):
            client.responses.retrieve(response_id)
