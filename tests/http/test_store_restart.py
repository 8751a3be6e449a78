"""The SQLite store across a killed server: a new process on the same file finds what the
old one stored, ends the jobs it left unfinished, keeps wall-clock TTLs, refuses a second
server on the file, and loses no acknowledged write (fake engine, separate processes)."""

from __future__ import annotations

import contextlib
import re
import sqlite3
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx

from mlxcel.store.backend import RESTART_MESSAGE
from mlxcel.store.codec import decode, encoded_size

from server_process import MODEL, ServerProcesses
from support import LONG

TOOL = {
    "type": "function",
    "name": "lookup",
    "description": "Look a word up.",
    "parameters": {"type": "object", "properties": {"word": {"type": "string"}}},
}


def _get(http: httpx.Client, path: str) -> bytes:
    r = http.get(path)
    assert r.status_code == 200, (path, r.status_code, r.text)
    return r.content


def _poll(http: httpx.Client, response_id: str, statuses: tuple[str, ...]) -> dict[str, Any]:
    deadline = time.monotonic() + 20
    while True:
        body: dict[str, Any] = http.get(f"/v1/responses/{response_id}").json()
        if body["status"] in statuses:
            return body
        assert time.monotonic() < deadline, body
        time.sleep(0.02)


def test_a_killed_server_comes_back_with_everything_it_stored(
    servers: ServerProcesses, tmp_path: Path
) -> None:
    path = tmp_path / "store.sqlite3"
    store = ("--store", f"sqlite:{path}", "--parallel", "1")
    first = servers.start(*store, hold="w0")  # the long job stays in flight until killed
    client = first.client()
    one = client.responses.create(
        model=MODEL,
        input="echo: héllo ✓ 日本",
        instructions="Be terse.",
        metadata={"k": "v"},
        tools=[TOOL],  # type: ignore[list-item]
        temperature=0,
    )
    two = client.responses.create(model=MODEL, input="echo: beta", previous_response_id=one.id)
    chained = client.responses.input_tokens.count(
        model=MODEL, input="echo: gamma", previous_response_id=two.id
    ).input_tokens
    alone = client.responses.input_tokens.count(model=MODEL, input="echo: gamma").input_tokens
    assert chained > alone
    texts = [f"echo: item {n}" for n in range(20)]
    conv = client.conversations.create(
        items=[{"role": "user", "content": t} for t in texts[:10]], metadata={"n": "20"}
    )
    client.conversations.items.create(
        conv.id, items=[{"role": "user", "content": t} for t in texts[10:]]
    )
    ephemeral = client.responses.create(
        model=MODEL, input="echo: not stored", background=True, store=False
    )
    with first.http() as http:
        done = _poll(http, ephemeral.id, ("completed",))
        assert done["output"][0]["content"][0]["text"] == "not stored"
        running = client.responses.create(model=MODEL, input=LONG, background=True)
        _poll(http, running.id, ("in_progress",))
        queued = client.responses.create(model=MODEL, input="echo: waits", background=True)
        unstored = client.responses.create(
            model=MODEL, input="echo: waits too", background=True, store=False
        )
        assert (queued.status, unstored.status) == ("queued", "queued")
        paths = [f"/v1/responses/{r.id}" for r in (one, two, ephemeral)]
        paths += [f"/v1/responses/{r.id}/input_items" for r in (one, two)]
        paths += [f"/v1/conversations/{conv.id}", f"/v1/conversations/{conv.id}/items?limit=100"]
        before = {url: _get(http, url) for url in paths}
        first.kill()

    second = servers.start(*store)
    with second.http() as http:
        for job in (running, queued, unstored):  # the first look already finds each ended
            r = http.get(f"/v1/responses/{job.id}")
            assert r.status_code == 200, r.text
            body = r.json()
            assert body["status"] == "failed", body
            assert body["error"] == {"code": "server_error", "message": RESTART_MESSAGE}
            assert body["background"] is True
        assert {url: _get(http, url) for url in paths} == before
    with contextlib.closing(sqlite3.connect(path)) as db:  # each where its final object goes
        tables = dict(db.execute("SELECT id, tbl FROM entries WHERE tbl != 'conversations'"))
    assert tables == {
        one.id: "responses",
        two.id: "responses",
        running.id: "responses",
        queued.id: "responses",
        ephemeral.id: "ephemeral",
        unstored.id: "ephemeral",
    }
    items = second.client().conversations.items.list(conv.id, order="asc", limit=100)
    assert [i.content[0].text for i in items.data] == texts  # type: ignore[union-attr]
    three = second.client().responses.create(
        model=MODEL, input="echo: gamma", previous_response_id=two.id
    )
    assert three.output_text == "gamma"
    assert three.usage is not None
    assert three.usage.input_tokens == chained
    answer = one.output[0]  # an item of a stored response is found by its id
    referenced = second.client().responses.create(
        model=MODEL,
        input=[
            {"type": "item_reference", "id": answer.id},
            {"role": "user", "content": "echo: again"},
        ],  # type: ignore[list-item]
    )
    listed = second.client().responses.input_items.list(referenced.id, order="asc")
    assert listed.data[0].model_dump() == answer.model_dump()


def test_expiry_keeps_counting_while_the_server_is_down(
    servers: ServerProcesses, tmp_path: Path
) -> None:
    short = tmp_path / "short.sqlite3"
    long = tmp_path / "long.sqlite3"
    ttls = ("--responses-store-ttl-secs", "--conversation-store-ttl-secs")
    ttls += ("--responses-background-ephemeral-ttl-secs",)

    def flags(path: Path, secs: str) -> list[str]:
        return ["--store", f"sqlite:{path}", *(x for ttl in ttls for x in (ttl, secs))]

    cases = ((short, "2", 404), (long, "3600", 200))
    kept: dict[Path, list[str]] = {}
    started = [(servers.launch(*flags(path, secs)), path) for path, secs, _ in cases]
    for server, path in started:
        server.wait_ready()
        client = server.client()
        ephemeral = client.responses.create(
            model=MODEL, input="echo: not stored", background=True, store=False
        )
        response = client.responses.create(model=MODEL, input="echo: kept a while")
        conv = client.conversations.create(items=[{"role": "user", "content": "hi"}])
        with server.http() as http:
            _poll(http, ephemeral.id, ("completed",))
        kept[path] = [
            f"/v1/responses/{response.id}",
            f"/v1/conversations/{conv.id}",
            f"/v1/responses/{ephemeral.id}",
        ]
    stored = time.time()  # every entry was written by now
    for server, _ in started:
        server.kill()
    time.sleep(max(0.0, stored + 3 - time.time()))
    restarted = [(servers.launch(*flags(path, secs)), path, status) for path, secs, status in cases]
    for server, path, status in restarted:
        server.wait_ready()
        with server.http() as http:
            assert [http.get(p).status_code for p in kept[path]] == [status] * 3


def test_recency_survives_a_restart(servers: ServerProcesses, tmp_path: Path) -> None:
    store = ("--store", f"sqlite:{tmp_path / 'store.sqlite3'}")
    store += ("--responses-store-max-entries", "3")
    first = servers.start(*store)
    client = first.client()
    ids = [client.responses.create(model=MODEL, input=f"echo: {n}").id for n in range(3)]
    client.responses.retrieve(ids[0])  # least recently used now: 1, then 2, then 0
    first.kill()
    second = servers.start(*store)
    client = second.client()
    client.responses.retrieve(ids[2])  # read after the restart: the most recent of all
    ids += [client.responses.create(model=MODEL, input=f"echo: {n}").id for n in (3, 4)]
    with second.http() as http:
        kept = [http.get(f"/v1/responses/{i}").status_code for i in ids]
    assert kept == [404, 404, 200, 200, 200]


def test_a_second_server_on_the_same_file_stops_and_the_first_serves_on(
    servers: ServerProcesses, tmp_path: Path
) -> None:
    path = tmp_path / "store.sqlite3"
    # How long this interpreter takes to start and import the server, to leave it out.
    began = time.monotonic()
    assert servers.launch("--version").proc.wait(timeout=60) == 0
    startup = time.monotonic() - began
    first = servers.start("--store", f"sqlite:{path}")
    stored = first.client().responses.create(model=MODEL, input="echo: first")
    began = time.monotonic()
    second = servers.launch("--store", f"sqlite:{path}")
    assert second.proc.wait(timeout=startup + 2) == 2
    assert time.monotonic() - began < startup + 2
    message = second.log.read_text()
    assert str(path) in message, message
    assert re.search(r"in use|another server", message), message
    assert first.proc.poll() is None
    client = first.client()
    assert client.responses.retrieve(stored.id).output_text == "first"
    assert client.responses.create(model=MODEL, input="echo: still here").output_text == (
        "still here"
    )


def test_a_store_that_cannot_be_made_stops_start_up(
    servers: ServerProcesses, tmp_path: Path
) -> None:
    (tmp_path / "file").write_text("not a folder")
    path = tmp_path / "file" / "store.sqlite3"
    server = servers.launch("--store", f"sqlite:{path}")
    assert server.proc.wait(timeout=60) == 2
    message = server.log.read_text()
    assert f"fake-server: error: the store {path} cannot be opened" in message, message
    assert "Traceback" not in message


WRITERS, APPENDS = 10, 10
PAD = "x" * 2000  # each item large enough that a torn write would show


def _text(writer: int, seq: int) -> str:
    return f"writer {writer} seq {seq} {PAD}"


def test_appends_cut_by_a_kill_leave_a_clean_prefix(
    servers: ServerProcesses, tmp_path: Path
) -> None:
    path = tmp_path / "store.sqlite3"
    first = servers.start("--store", f"sqlite:{path}")
    conv_id = first.client().conversations.create().id
    acked: dict[tuple[int, int], str] = {}
    lock = threading.Lock()
    enough = threading.Event()

    def writer(w: int) -> None:
        with first.http() as http:
            for s in range(APPENDS):
                item = {"type": "message", "role": "user", "content": _text(w, s)}
                try:
                    r = http.post(f"/v1/conversations/{conv_id}/items", json={"items": [item]})
                except httpx.TransportError:
                    return  # killed
                assert r.status_code == 200, r.text
                with lock:
                    acked[w, s] = r.json()["data"][0]["id"]
                    if len(acked) >= WRITERS * APPENDS // 3:
                        enough.set()

    with ThreadPoolExecutor(WRITERS) as pool:
        futures = [pool.submit(writer, w) for w in range(WRITERS)]
        assert enough.wait(timeout=30)
        first.kill()
        for future in futures:
            future.result()
    assert len(acked) < WRITERS * APPENDS  # the kill cut the appends short

    second = servers.start("--store", f"sqlite:{path}")
    with second.http() as http:
        listed = http.get(f"/v1/conversations/{conv_id}/items?order=asc&limit=100").json()
        assert listed["has_more"] is False
        found: dict[tuple[int, int], str] = {}
        order: dict[int, list[int]] = {w: [] for w in range(WRITERS)}
        for item in listed["data"]:
            text = item["content"][0]["text"]
            match = re.fullmatch(r"writer (\d+) seq (\d+) (x+)", text)
            assert match is not None, text[:80]
            assert match[3] == PAD, text[:80]  # whole
            key = (int(match[1]), int(match[2]))
            assert key not in found, key  # no duplicates
            found[key] = item["id"]
            order[key[0]].append(key[1])
        assert all(found.get(key) == item_id for key, item_id in acked.items())  # none lost
        for w, seqs in order.items():  # each writer's appends in its order, none skipped
            assert seqs == list(range(len(seqs))), (w, seqs)
        with contextlib.closing(sqlite3.connect(path)) as db:
            assert db.execute("PRAGMA integrity_check").fetchall() == [("ok",)]
        # The statistics the restarted server keeps agree with a count of the file, and
        # go on agreeing as it writes.
        assert _store_gauges(http) == _counted(path)
        item = {"type": "message", "role": "user", "content": "one more"}
        r = http.post(f"/v1/conversations/{conv_id}/items", json={"items": [item]})
        assert r.status_code == 200, r.text
        assert _store_gauges(http) == _counted(path)


def _store_gauges(http: httpx.Client) -> tuple[int, int]:
    """The conversations table's entries and bytes, as `/metrics` reports them."""
    text = http.get("/metrics").text
    found = dict(
        re.findall(r'^mlxcel_store_(entries|bytes)\{table="conversations"\} (\S+)$', text, re.M)
    )
    return int(float(found["entries"])), int(float(found["bytes"]))


def _counted(path: Path) -> tuple[int, int]:
    """The conversations stored in the file and the bytes of their encodings, counted."""
    with contextlib.closing(sqlite3.connect(path)) as db:
        bodies = [b for (b,) in db.execute("SELECT body FROM entries WHERE tbl = 'conversations'")]
    assert all(encoded_size(decode(body)) == len(body) for body in bodies)
    return len(bodies), sum(len(body) for body in bodies)


def test_a_dropped_reasoning_trace_comes_back_after_a_restart(
    servers: ServerProcesses, tmp_path: Path
) -> None:
    path = tmp_path / "store.sqlite3"
    first = servers.start("--store", f"sqlite:{path}")
    said = [{"role": "user", "content": "echo: <think>secret plan</think> answer"}]
    with first.http() as http:
        created = http.post("/v1/responses", json={"model": MODEL, "input": said}).json()
    assert [item["type"] for item in created["output"]] == ["reasoning", "message"]
    first.kill()

    reasoning, message = created["output"]
    nxt = {"role": "user", "content": "echo: next"}
    without_trace = {"model": MODEL, "input": [*said, message, nxt]}
    with_trace = {"model": MODEL, "input": [*said, reasoning, message, nxt]}
    second = servers.start("--store", f"sqlite:{path}")
    with second.http() as http:
        counts = [
            http.post("/v1/responses/input_tokens", json=body).json()["input_tokens"]
            for body in (without_trace, with_trace)
        ]
    # The trace the client dropped is put back from the store: the prompt is the one the
    # client would have sent with it.
    assert counts[0] == counts[1]
    third = servers.start("--store", f"sqlite:{tmp_path / 'other.sqlite3'}")
    with third.http() as http:
        fresh = http.post("/v1/responses/input_tokens", json=without_trace).json()
    assert fresh["input_tokens"] < counts[0]  # a store that never saw the turn has nothing
