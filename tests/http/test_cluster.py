"""Replicas sharing one Redis store: three fake-engine server processes (real command-line
flags, a lease of 2 s) answer any id any of them stored, append concurrently without
loss, keep the store's budgets, route cancels to a job's owner, reap the jobs of a
replica that died or froze past its lease (and never let its late writes through),
generate each job exactly once, and ride out a Redis outage with 503s.

Each test talks to the replicas over real HTTP with the `openai` SDK. Replicas that a
test kills or freezes are its own (an extra replica on the shared store, `owner`); the
others are started once per module."""

from __future__ import annotations

import itertools
import re
import signal
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import httpx
import openai
import pytest
from openai import OpenAI
from openai.types.responses import Response
from pydantic import BaseModel

from mlxcel.actors.store_backend import RESTART_MESSAGE

from redis_server import RedisServer
from server_process import MODEL, ServerProcess, ServerProcesses

LEASE_SECS = 2.0
REAP_SECS = LEASE_SECS / 3
"""A replica renews its lease, and reaps, every third of the lease."""
STEP_DELAY = 0.02
LONG = "echo: " + " ".join(f"w{i}" for i in range(400))  # 8 s at 20 ms a step
UNFINISHED = ("queued", "in_progress")


@dataclass
class Cluster:
    redis: RedisServer
    prefix: str
    replicas: list[ServerProcess]
    clients: list[OpenAI]
    flags: tuple[str, ...]

    def round_robin(self) -> Callable[[], OpenAI]:
        """A client per call, each replica in turn (thread-safe)."""
        turn = itertools.cycle(self.clients)
        lock = threading.Lock()

        def next_client() -> OpenAI:
            with lock:
                return next(turn)

        return next_client

    def hlen(self, table: str) -> int:
        found = self.redis.call("HLEN", f"{{{self.prefix}}}:{table}:body")
        assert isinstance(found, int)
        return found


def _store_flags(redis: RedisServer, prefix: str, *extra: str) -> tuple[str, ...]:
    flags = ("--store", redis.url, "--redis-key-prefix", prefix)
    return (*flags, "--replica-lease-secs", str(LEASE_SECS), *extra)


def _cluster(servers: ServerProcesses, redis: RedisServer, prefix: str, *extra: str) -> Cluster:
    flags = _store_flags(redis, prefix, *extra)
    replicas = servers.start_replicas(3, *flags, step_delay=STEP_DELAY)
    return Cluster(redis, prefix, replicas, [r.client() for r in replicas], flags)


@pytest.fixture(scope="module")
def module_servers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcesses]:
    started = ServerProcesses(tmp_path_factory.mktemp("cluster"))
    try:
        yield started
    finally:
        started.close()


@pytest.fixture(scope="module")
def cluster(module_servers: ServerProcesses, redis_server: RedisServer) -> Cluster:
    """Three replicas on the session's Redis, under a prefix of this module's own."""
    return _cluster(module_servers, redis_server, f"cluster-{time.monotonic_ns()}")


@pytest.fixture
def servers(tmp_path: Path) -> Iterator[ServerProcesses]:
    started = ServerProcesses(tmp_path)
    try:
        yield started
    finally:
        started.close()


@pytest.fixture
def owner(servers: ServerProcesses, cluster: Cluster) -> ServerProcess:
    """A fourth replica on the cluster's store with one slot, for a test to kill or freeze."""
    return servers.start(*cluster.flags, "--parallel", "1", step_delay=STEP_DELAY)


def _poll(
    client: OpenAI, response_id: str, until: tuple[str, ...], secs: float = 20
) -> tuple[Response, list[str]]:
    """Retrieve until the status is one of `until`; the record and every status seen
    (a 404 or any other error fails the test at once)."""
    deadline = time.monotonic() + secs
    seen: list[str] = []
    while True:
        record = client.responses.retrieve(response_id)
        seen.append(record.status or "")
        if record.status in until:
            return record, seen
        assert time.monotonic() < deadline, (response_id, seen[-5:])
        time.sleep(0.01)


def _metric(replica: ServerProcess, series: str) -> float:
    text = httpx.get(f"{replica.url}/metrics", timeout=10).text
    found = re.search(rf"^{re.escape(series)} (\S+)$", text, re.MULTILINE)
    assert found is not None, series
    return float(found.group(1))


def _texts(items: Sequence[BaseModel]) -> list[str]:
    """The text of each message item."""
    return [str(item.model_dump()["content"][0]["text"]) for item in items]


GENERATIONS = "mlxcel_response_duration_seconds_count"
"""Responses a replica's slots ran to their end (one per generation)."""


# --- 1. any replica answers any id ---------------------------------------------------


def test_any_replica_answers_any_id(cluster: Cluster) -> None:
    r1, r2, r3 = cluster.clients
    one = r1.responses.create(model=MODEL, input="echo: alpha beta")
    assert one.output_text == "alpha beta"
    assert r2.responses.retrieve(one.id).model_dump() == one.model_dump()
    items = r3.responses.input_items.list(one.id)
    assert _texts(items.data) == ["echo: alpha beta"]

    two = r3.responses.create(model=MODEL, input="echo: gamma", previous_response_id=one.id)
    alone = r3.responses.create(model=MODEL, input="echo: gamma")
    assert two.output_text == alone.output_text == "gamma"
    assert two.usage is not None
    assert alone.usage is not None
    assert two.usage.input_tokens > alone.usage.input_tokens  # R1's turn is in the prompt

    conv = r1.conversations.create()
    first = r1.responses.create(model=MODEL, input="echo: first", conversation=conv.id)
    assert first.output_text == "first"
    second = r2.responses.create(model=MODEL, input="echo: second", conversation=conv.id)
    lone = r2.responses.create(model=MODEL, input="echo: second")
    assert second.usage is not None
    assert lone.usage is not None
    assert second.usage.input_tokens > lone.usage.input_tokens
    listed = r3.conversations.items.list(conv.id, order="asc")
    texts = _texts(listed.data)
    assert texts == ["echo: first", "first", "echo: second", "second"]

    r2.responses.delete(one.id)
    for client in (r1, r2, r3):
        with pytest.raises(openai.NotFoundError):
            client.responses.retrieve(one.id)
    assert r3.responses.retrieve(two.id).id == two.id  # its successor stays


# --- 2. concurrent appends -----------------------------------------------------------


def test_concurrent_appends_from_three_replicas_lose_nothing(cluster: Cluster) -> None:
    conv = cluster.clients[0].conversations.create()
    per_writer = 30

    def write(writer: int) -> None:
        client = cluster.clients[writer]
        for n in range(per_writer):
            client.conversations.items.create(
                conv.id, items=[{"role": "user", "content": f"w{writer}-{n}"}]
            )

    with ThreadPoolExecutor(3) as pool:
        list(pool.map(write, range(3)))
    listed = cluster.clients[1].conversations.items.list(conv.id, order="asc", limit=100)
    texts = _texts(listed.data)
    assert len(texts) == 3 * per_writer
    for writer in range(3):
        mine = [t for t in texts if t.startswith(f"w{writer}-")]
        assert mine == [f"w{writer}-{n}" for n in range(per_writer)]


# --- 3. budgets under concurrent puts ------------------------------------------------


def test_the_entry_cap_holds_under_concurrent_puts(
    servers: ServerProcesses, redis_server: RedisServer, redis_prefix: str
) -> None:
    cap = 5
    small = _cluster(servers, redis_server, redis_prefix, "--responses-store-max-entries", str(cap))
    sizes: list[int] = []
    done = threading.Event()

    def sample() -> None:
        while not done.is_set():
            sizes.append(small.hlen("responses"))

    sampler = threading.Thread(target=sample)
    sampler.start()
    client = small.round_robin()
    try:
        with ThreadPoolExecutor(12) as pool:
            made = list(
                pool.map(
                    lambda n: client().responses.create(model=MODEL, input=f"echo: n{n}"),
                    range(60),
                )
            )
    finally:
        done.set()
        sampler.join()
    assert len(sizes) > 10, sizes  # sampled all along
    assert max(sizes) <= cap, sizes
    assert small.hlen("responses") == cap
    kept = small.redis.call("HKEYS", f"{{{small.prefix}}}:responses:body")
    assert isinstance(kept, list)
    assert {k.decode() for k in kept if isinstance(k, bytes)} <= {r.id for r in made}
    for replica in small.replicas:
        assert _metric(replica, 'mlxcel_store_entries{table="responses"}') == cap
    last = small.clients[0].responses.create(model=MODEL, input="echo: last")
    assert small.clients[2].responses.retrieve(last.id).output_text == "last"
    assert small.hlen("responses") == cap


# --- 4. a background job polled elsewhere --------------------------------------------


def test_a_background_job_is_polled_to_completion_on_other_replicas(cluster: Cluster) -> None:
    r1, r2, r3 = cluster.clients
    words = [f"b{n}" for n in range(40)]
    job = r1.responses.create(model=MODEL, input="echo: " + " ".join(words), background=True)
    seen: list[str] = []
    deadline = time.monotonic() + 20
    while not seen or seen[-1] != "completed":
        for client in (r2, r3):
            seen.append(client.responses.retrieve(job.id).status or "")
        assert time.monotonic() < deadline, seen[-5:]
        time.sleep(0.01)
    assert seen[0] in UNFINISHED  # the unfinished job was seen from elsewhere too
    assert set(seen) <= {*UNFINISHED, "completed"}
    assert r3.responses.retrieve(job.id).output_text == " ".join(words)


# --- 5. a cancel routed to the owner -------------------------------------------------


def test_a_cancel_on_another_replica_ends_the_job_and_frees_its_slot(
    cluster: Cluster, owner: ServerProcess
) -> None:
    r1 = owner.client()
    _, r2, r3 = cluster.clients
    job = r1.responses.create(model=MODEL, input=LONG, background=True)
    _poll(r2, job.id, ("in_progress",))
    started = time.monotonic()
    cancelled = r2.responses.cancel(job.id)
    took = time.monotonic() - started
    assert cancelled.status == "cancelled"
    assert took < 1.0, took  # the target bound (pub/sub takes tens of ms)
    assert r3.responses.retrieve(job.id).status == "cancelled"
    assert r1.responses.retrieve(job.id).status == "cancelled"

    started = time.monotonic()
    following = r1.responses.create(model=MODEL, input=LONG, background=True)
    _poll(r1, following.id, ("in_progress",), secs=1.0)  # the one slot was freed
    assert time.monotonic() - started < 1.0
    assert r3.responses.cancel(following.id).status == "cancelled"


# --- 6. a killed owner's jobs are reaped ---------------------------------------------


def test_a_killed_replicas_jobs_end_failed_on_the_others(
    cluster: Cluster, owner: ServerProcess
) -> None:
    r1 = owner.client()
    _, r2, r3 = cluster.clients
    running = r1.responses.create(model=MODEL, input=LONG, background=True)
    _poll(r2, running.id, ("in_progress",))
    queued = r1.responses.create(model=MODEL, input="echo: waits", background=True)
    assert r3.responses.retrieve(queued.id).status == "queued"
    owner.kill()
    killed = time.monotonic()
    bound = LEASE_SECS + REAP_SECS + 1.0  # the target bound, with 1 s of slack
    for job, client in ((running, r2), (queued, r3)):
        record, seen = _poll(client, job.id, ("failed",), secs=bound + 5)
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
    _poll(r2, job.id, ("in_progress",))
    owner.pause()
    paused = time.monotonic()
    try:
        reaped, _ = _poll(r3, job.id, ("failed",), secs=LEASE_SECS + REAP_SECS + 5)
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
        done, _ = _poll(r2, accepted.id, ("completed", "failed", "cancelled"))
        assert done.status == "completed", done.error
        assert done.output_text == words
    assert httpx.get(f"{owner.url}/health", timeout=10).status_code == 200
    assert r1.responses.create(model=MODEL, input="echo: awake").output_text == "awake"
    later = r1.responses.create(model=MODEL, input="echo: new job", background=True)
    done, _ = _poll(r2, later.id, ("completed", "failed", "cancelled"))
    assert done.status == "completed", done.error
    assert done.output_text == "new job"


# --- 8. each job generated exactly once ----------------------------------------------


def test_each_request_and_job_is_generated_exactly_once(cluster: Cluster) -> None:
    before = [_metric(r, GENERATIONS) for r in cluster.replicas]
    ended = 'mlxcel_background_jobs_ended_total{status="completed"}'
    jobs_before = [_metric(r, ended) for r in cluster.replicas]
    client = cluster.round_robin()
    count = 12

    def one(n: int) -> Response:
        return client().responses.create(
            model=MODEL, input=f"echo: job {n} a b c", background=n % 2 == 0
        )

    with ThreadPoolExecutor(6) as pool:
        made = list(pool.map(one, range(2 * count)))
    poller = cluster.round_robin()
    for record in made:
        done, _ = _poll(poller(), record.id, ("completed", "failed", "cancelled"))
        assert done.status == "completed", done.error
    after = [_metric(r, GENERATIONS) for r in cluster.replicas]
    jobs_after = [_metric(r, ended) for r in cluster.replicas]
    per_replica = [a - b for a, b in zip(after, before, strict=True)]
    assert per_replica == [2 * count / 3] * 3  # each ran what was sent to it, once
    assert sum(jobs_after) - sum(jobs_before) == count


# --- 9. a Redis outage ---------------------------------------------------------------


def test_a_redis_outage_answers_503_and_the_replicas_recover(
    servers: ServerProcesses, own_redis: RedisServer, redis_prefix: str
) -> None:
    cl = _cluster(servers, own_redis, redis_prefix)
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
    texts = _texts(r3.conversations.items.list(conv.id).data)
    assert texts == ["back"]
    for client in cl.clients:
        job = client.responses.create(model=MODEL, input="echo: job after", background=True)
        done, _ = _poll(cl.clients[0], job.id, ("completed", "failed", "cancelled"))
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

    before = lease_keys()
    owner.proc.send_signal(signal.SIGTERM)
    assert owner.proc.wait(timeout=30) == 0, owner.log.read_text()
    assert "Traceback" not in owner.log.read_text()
    gone = before - lease_keys()
    assert len(gone) == 1  # the stopped replica's lease, given up at once
    assert len(lease_keys()) == len(cluster.replicas)
    done, _ = _poll(cluster.clients[1], job.id, ("completed", "failed", "cancelled"), secs=5)
    assert done.status in ("completed", "failed")  # drained or ended by the shutdown
