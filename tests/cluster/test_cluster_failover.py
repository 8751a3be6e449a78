"""Replicas sharing one Redis store when one of them, or Redis, fails: a cancel sent to
another replica reaches the job's owner and frees its slot, a killed or frozen owner's
jobs are reaped to `failed` by the others (and stay so when it thaws), a Redis outage
answers 503 until it ends, and a replica stopped by SIGTERM leaves cleanly. The replica
that fails is a test's own (`owner`, fixtures in `conftest.py`)."""

from __future__ import annotations

import signal
import time
from collections.abc import Callable

import httpx
import openai
import pytest
from replica_cluster import (
    LEASE_SECS,
    REAP_SECS,
    UNFINISHED,
    Cluster,
    poll,
    start_cluster,
    texts,
)

from mlxcel.store.backend import RESTART_MESSAGE

from redis_server import RedisServer
from server_process import MODEL, ServerProcess, ServerProcesses
from support import LONG

# --- 5. a cancel routed to the owner -------------------------------------------------


def test_a_cancel_on_another_replica_ends_the_job_and_frees_its_slot(
    cluster: Cluster, owner: ServerProcess
) -> None:
    r1 = owner.client()
    _, r2, r3 = cluster.clients
    job = r1.responses.create(model=MODEL, input=LONG, background=True)
    poll(r2, job.id, ("in_progress",))
    started = time.monotonic()
    cancelled = r2.responses.cancel(job.id)
    took = time.monotonic() - started
    assert cancelled.status == "cancelled"
    assert took < 1.0, took  # the target bound (pub/sub takes tens of ms)
    assert r3.responses.retrieve(job.id).status == "cancelled"
    assert r1.responses.retrieve(job.id).status == "cancelled"

    started = time.monotonic()
    following = r1.responses.create(model=MODEL, input=LONG, background=True)
    poll(r1, following.id, ("in_progress",), secs=1.0)  # the one slot was freed
    assert time.monotonic() - started < 1.0
    assert r3.responses.cancel(following.id).status == "cancelled"


# --- 6. a killed owner's jobs are reaped ---------------------------------------------


def test_a_killed_replicas_jobs_end_failed_on_the_others(
    cluster: Cluster, owner: ServerProcess
) -> None:
    r1 = owner.client()
    _, r2, r3 = cluster.clients
    running = r1.responses.create(model=MODEL, input=LONG, background=True)
    poll(r2, running.id, ("in_progress",))
    queued = r1.responses.create(model=MODEL, input="echo: waits", background=True)
    assert r3.responses.retrieve(queued.id).status == "queued"
    owner.kill()
    killed = time.monotonic()
    bound = LEASE_SECS + REAP_SECS + 1.0  # the target bound, with 1 s of slack
    for job, client in ((running, r2), (queued, r3)):
        record, seen = poll(client, job.id, ("failed",), secs=bound + 5)
        assert time.monotonic() - killed < bound, seen
        assert set(seen) <= {*UNFINISHED, "failed"}
        assert record.error is not None
        assert (record.error.code, record.error.message) == ("server_error", RESTART_MESSAGE)
        assert record.background is True


# --- 7. a frozen owner is reaped, and its late writes are fenced ---------------------


def test_a_frozen_replicas_job_stays_reaped_after_it_thaws(
    cluster: Cluster, owner: ServerProcess
) -> None:
    r1 = owner.client()
    _, r2, r3 = cluster.clients
    job = r1.responses.create(model=MODEL, input=LONG, background=True)
    poll(r2, job.id, ("in_progress",))
    owner.pause()
    paused = time.monotonic()
    try:
        reaped, _ = poll(r3, job.id, ("failed",), secs=LEASE_SECS + REAP_SECS + 5)
        time.sleep(max(0.0, 2 * LEASE_SECS - (time.monotonic() - paused)))
    finally:
        owner.resume()
    # Jobs accepted as it thaws run under a lease of their own (not reaped by the others).
    words = " ".join(f"t{n}" for n in range(40))
    fresh = [
        r1.responses.create(model=MODEL, input=f"echo: {words}", background=True) for _ in range(3)
    ]
    assert reaped.error is not None
    assert (reaped.error.code, reaped.error.message) == ("server_error", RESTART_MESSAGE)
    thawed = time.monotonic()
    while time.monotonic() - thawed < 3.0:  # the owner wakes, and its writes are refused
        for client in (r1, r2, r3):
            assert client.responses.retrieve(job.id).model_dump() == reaped.model_dump()
        time.sleep(0.05)

    for accepted in fresh:
        done, _ = poll(r2, accepted.id, ("completed", "failed", "cancelled"))
        assert done.status == "completed", done.error
        assert done.output_text == words
    assert httpx.get(f"{owner.url}/health", timeout=10).status_code == 200
    assert r1.responses.create(model=MODEL, input="echo: awake").output_text == "awake"
    later = r1.responses.create(model=MODEL, input="echo: new job", background=True)
    done, _ = poll(r2, later.id, ("completed", "failed", "cancelled"))
    assert done.status == "completed", done.error
    assert done.output_text == "new job"


# --- 9. a Redis outage ---------------------------------------------------------------


def test_a_redis_outage_answers_503_and_the_replicas_recover(
    servers: ServerProcesses, own_redis: RedisServer, redis_prefix: str
) -> None:
    cl = start_cluster(servers, own_redis, redis_prefix)
    r1, r2, r3 = cl.clients
    kept = r1.responses.create(model=MODEL, input="echo: before the outage")
    conv = r2.conversations.create()
    own_redis.stop()
    stopped = time.monotonic()
    try:
        attempts: list[Callable[[], object]] = [
            lambda: r2.responses.retrieve(kept.id),
            lambda: r3.responses.create(model=MODEL, input="echo: x", background=True),
            lambda: r1.conversations.create(),
            lambda: r3.conversations.items.list(conv.id),
        ]
        while True:  # past a whole lease: the replicas lose their leases too
            for attempt in attempts:
                with pytest.raises(openai.APIStatusError) as refused:
                    attempt()
                assert refused.value.status_code == 503
                assert refused.value.code == "store_unavailable"
                assert refused.value.response.headers["retry-after"] == "1"
            for replica in cl.replicas:
                assert httpx.get(f"{replica.url}/health", timeout=10).status_code == 200
            if time.monotonic() - stopped > LEASE_SECS + REAP_SECS:
                break
            time.sleep(0.2)
    finally:
        own_redis.start()

    deadline = time.monotonic() + 10
    for replica in cl.replicas:  # each reconnects by itself
        url = f"{replica.url}/v1/responses/{kept.id}"
        while (got := httpx.get(url, timeout=10)).status_code == 503:
            assert time.monotonic() < deadline
            time.sleep(0.1)
        assert got.status_code == 200, got.text
    found = [c.responses.retrieve(kept.id) for c in cl.clients]
    assert all(f.output_text == "before the outage" for f in found)
    after = r2.responses.create(model=MODEL, input="echo: after")
    assert r3.responses.retrieve(after.id).output_text == "after"
    r1.conversations.items.create(conv.id, items=[{"role": "user", "content": "back"}])
    added = texts(r3.conversations.items.list(conv.id).data)
    assert added == ["back"]
    for client in cl.clients:
        job = client.responses.create(model=MODEL, input="echo: job after", background=True)
        done, _ = poll(cl.clients[0], job.id, ("completed", "failed", "cancelled"))
        assert done.status == "completed", done.error


# --- a clean stop --------------------------------------------------------------------


def test_a_replica_stopped_by_sigterm_exits_cleanly_and_gives_its_lease_up(
    cluster: Cluster, owner: ServerProcess
) -> None:
    r1 = owner.client()
    assert r1.responses.create(model=MODEL, input="echo: bye").output_text == "bye"
    job = r1.responses.create(model=MODEL, input="echo: a b c", background=True)
    leases = f"{{{cluster.prefix}}}:lease:*"

    def lease_keys() -> set[bytes]:
        keys = cluster.redis.call("KEYS", leases)
        assert isinstance(keys, list)
        return {k for k in keys if isinstance(k, bytes)}

    # An earlier test's killed or frozen replica holds its lease until it lapses: wait
    # for that, so the keys are those of the live replicas alone.
    deadline = time.monotonic() + 30
    while len(lease_keys()) != len(cluster.replicas) + 1 and time.monotonic() < deadline:
        time.sleep(0.1)
    before = lease_keys()
    assert len(before) == len(cluster.replicas) + 1
    owner.proc.send_signal(signal.SIGTERM)
    assert owner.proc.wait(timeout=30) == 0, owner.log.read_text()
    assert "Traceback" not in owner.log.read_text()
    gone = before - lease_keys()
    assert len(gone) == 1  # the stopped replica's lease, given up at once
    assert len(lease_keys()) == len(cluster.replicas)
    done, _ = poll(cluster.clients[1], job.id, ("completed", "failed", "cancelled"), secs=5)
    assert done.status in ("completed", "failed")  # drained or ended by the shutdown
