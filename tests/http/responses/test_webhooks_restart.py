"""Webhooks across a SIGKILL on the SQLite store (fake engine, separate processes): a
delivery left unsent when the server died is sent by the next process on the file, under
the same `webhook-id`, and a job the killed process left running is announced
`response.failed` once the next one reaps it."""

from __future__ import annotations

import time
from pathlib import Path

from server_process import MODEL, ServerProcesses
from support import LONG
from webhook_receiver import SECRET, receiver, unwrap


def _flags(path: Path, url: str) -> tuple[str, ...]:
    return (
        *("--store", f"sqlite:{path}", "--parallel", "1"),
        *("--webhook-url", url, "--webhook-secret", SECRET),
        *("--webhook-backoff-secs", "2", "--webhook-timeout-secs", "2"),
        # A job whose end is unknown is rechecked a third of this often.
        *("--replica-lease-secs", "0.6"),
    )


def test_a_delivery_cut_by_sigkill_is_sent_after_the_restart(
    servers: ServerProcesses, tmp_path: Path
) -> None:
    path = tmp_path / "store.sqlite3"
    with receiver([500]) as hook:
        first = servers.start(*_flags(path, hook.url))
        job = first.client().responses.create(model=MODEL, input="echo: done", background=True)
        (failed,) = hook.wait_for(1)
        first.kill()  # its retry was 1 to 2 s away
        assert unwrap(failed).data.id == job.id
        second = servers.start(*_flags(path, hook.url))
        _, delivered = hook.wait_for(2)
        time.sleep(1.0)
        assert len(hook.hits) == 2  # delivered once: nothing more after the 200
        assert delivered.headers["webhook-id"] == failed.headers["webhook-id"]
        event = unwrap(delivered)  # signed afresh: its timestamp is the new attempt's
        assert event.type == "response.completed"
        assert event.data.id == job.id
        assert second.client().responses.retrieve(job.id).status == "completed"


def test_a_job_killed_in_flight_is_announced_failed_by_the_next_process(
    servers: ServerProcesses, tmp_path: Path
) -> None:
    path = tmp_path / "store.sqlite3"
    with receiver() as hook:
        first = servers.start(*_flags(path, hook.url), hold="w0")
        client = first.client()
        job = client.responses.create(model=MODEL, input=LONG, background=True)
        deadline = time.monotonic() + 20
        while client.responses.retrieve(job.id).status != "in_progress":
            assert time.monotonic() < deadline
            time.sleep(0.02)
        first.kill()
        assert hook.hits == []
        second = servers.start(*_flags(path, hook.url))
        (hit,) = hook.wait_for(1)
        event = unwrap(hit)
        assert event.type == "response.failed"
        assert event.data.id == job.id
        assert second.client().responses.retrieve(job.id).status == "failed"
        ordinary = second.client().responses.create(model=MODEL, input="echo: fine")
        assert ordinary.output_text == "fine"
