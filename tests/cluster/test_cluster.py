"""Replicas sharing one Redis store (three fake-engine server processes, real
command-line flags, a lease of 2 s): any replica answers any id any of them stored,
concurrent appends lose nothing, the store's budgets hold whichever replica writes, a
background job is polled anywhere, and each request or job is generated exactly once.
Over real HTTP with the `openai` SDK (fixtures in `conftest.py`)."""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor

import openai
import pytest
from openai.types.responses import Response
from replica_cluster import (
    GENERATIONS,
    UNFINISHED,
    Cluster,
    metric,
    poll,
    start_cluster,
    texts,
)

from redis_server import RedisServer
from server_process import MODEL, ServerProcesses

# --- 1. any replica answers any id ---------------------------------------------------


def test_any_replica_answers_any_id(cluster: Cluster) -> None:
    r1, r2, r3 = cluster.clients
    one = r1.responses.create(model=MODEL, input="echo: alpha beta")
    assert one.output_text == "alpha beta"
    assert r2.responses.retrieve(one.id).model_dump() == one.model_dump()
    items = r3.responses.input_items.list(one.id)
    assert texts(items.data) == ["echo: alpha beta"]

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
    assert texts(listed.data) == ["echo: first", "first", "echo: second", "second"]

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
    written = texts(listed.data)
    assert len(written) == 3 * per_writer
    for writer in range(3):
        mine = [t for t in written if t.startswith(f"w{writer}-")]
        assert mine == [f"w{writer}-{n}" for n in range(per_writer)]


# --- 3. budgets under concurrent puts ------------------------------------------------


def test_the_entry_cap_holds_under_concurrent_puts(
    servers: ServerProcesses, redis_server: RedisServer, redis_prefix: str
) -> None:
    cap = 5
    small = start_cluster(
        servers, redis_server, redis_prefix, "--responses-store-max-entries", str(cap)
    )
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
        assert metric(replica, 'mlxcel_store_entries{table="responses"}') == cap
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


# --- 8. each job generated exactly once ----------------------------------------------


def test_each_request_and_job_is_generated_exactly_once(cluster: Cluster) -> None:
    before = [metric(r, GENERATIONS) for r in cluster.replicas]
    ended = 'mlxcel_background_jobs_ended_total{status="completed"}'
    jobs_before = [metric(r, ended) for r in cluster.replicas]
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
        done, _ = poll(poller(), record.id, ("completed", "failed", "cancelled"))
        assert done.status == "completed", done.error
    after = [metric(r, GENERATIONS) for r in cluster.replicas]
    jobs_after = [metric(r, ended) for r in cluster.replicas]
    per_replica = [a - b for a, b in zip(after, before, strict=True)]
    assert per_replica == [2 * count / 3] * 3  # each ran what was sent to it, once
    assert sum(jobs_after) - sum(jobs_before) == count
