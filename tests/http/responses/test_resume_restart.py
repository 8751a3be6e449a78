"""A background response's event log in the SQLite file across a restart: a finished
response's stream replays byte for byte from the next process, and the log of a job a
killed process left unfinished ends with the object the restart stored (fake engine,
separate processes)."""

from __future__ import annotations

import time
from pathlib import Path

import httpx
from resume_support import frames

from mlxcel.store.backend import RESTART_MESSAGE

from server_process import MODEL, ServerProcesses
from support import LONG


def _events(http: httpx.Client, response_id: str, **params: str) -> bytes:
    r = http.get(f"/v1/responses/{response_id}", params={"stream": "true", **params})
    assert r.status_code == 200, r.text
    return r.content


def _until(http: httpx.Client, response_id: str, status: str) -> None:
    deadline = time.monotonic() + 20
    while http.get(f"/v1/responses/{response_id}").json()["status"] != status:
        assert time.monotonic() < deadline
        time.sleep(0.02)


def test_a_finished_responses_stream_replays_after_a_restart(
    servers: ServerProcesses, tmp_path: Path
) -> None:
    store = ("--store", f"sqlite:{tmp_path / 'store.sqlite3'}")
    first = servers.start(*store)
    job = first.client().responses.create(
        model=MODEL, input="echo: " + " ".join(f"w{i}" for i in range(30)), background=True
    )
    with first.http() as http:
        _until(http, job.id, "completed")
        before = _events(http, job.id)
    first.kill()
    second = servers.start(*store)
    with second.http() as http:
        assert _events(http, job.id) == before
        assert frames(_events(http, job.id, starting_after="7")) == frames(before)[8:]
    numbers = []
    with second.client().responses.retrieve(job.id, stream=True, starting_after=7) as stream:
        numbers = [event.sequence_number for event in stream]
    assert numbers == list(range(8, len(frames(before))))


def test_the_log_of_a_job_killed_midway_ends_as_the_restart_ended_it(
    servers: ServerProcesses, tmp_path: Path
) -> None:
    store = ("--store", f"sqlite:{tmp_path / 'store.sqlite3'}")
    first = servers.start(*store, hold="w0")  # the job stays in flight after its first word
    job = first.client().responses.create(model=MODEL, input=LONG, background=True)
    with first.http() as http:
        _until(http, job.id, "in_progress")
        with http.stream("GET", f"/v1/responses/{job.id}", params={"stream": "true"}) as r:
            seen = b""
            for chunk in r.iter_bytes():
                seen += chunk
                if b"output_text.delta" in seen:
                    break
    first.kill()
    second = servers.start(*store)
    with second.http() as http:
        replay = frames(_events(http, job.id))  # waits for the log's end
        stored = http.get(f"/v1/responses/{job.id}").json()
    assert stored["status"] == "failed"
    assert stored["error"]["message"] == RESTART_MESSAGE
    assert replay[0].startswith(b"event: response.created")
    assert replay[-1].startswith(b"event: response.failed")
    assert seen.startswith(b"".join(replay[:2]))  # what the first process wrote, kept
    numbers = []
    with second.client().responses.retrieve(job.id, stream=True, starting_after=1) as stream:
        for event in stream:
            numbers.append(event.sequence_number)
            final = event
    assert numbers == list(range(2, len(replay)))
    assert final.type == "response.failed"
    retrieved = second.client().responses.retrieve(job.id)
    assert final.response.model_dump() == retrieved.model_dump()  # type: ignore[union-attr]
