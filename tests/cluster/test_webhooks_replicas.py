"""Webhooks from replicas sharing one Redis store (fake engine, separate processes): live
replicas never both send one delivery; a delivery left by a killed replica is sent by
another under the same `webhook-id`; a job killed in flight is announced
`response.failed` by the replica that reaps it."""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor

from redis_server import RedisServer
from server_process import MODEL, ServerProcess, ServerProcesses
from support import LONG, key_prefix
from webhook_receiver import SECRET, receiver, unwrap

LEASE = "1.2"


def _flags(redis: RedisServer, prefix: str, url: str) -> tuple[str, ...]:
    return (
        *("--store", redis.url, "--redis-key-prefix", prefix),
        *("--replica-lease-secs", LEASE),
        *("--webhook-url", url, "--webhook-secret", SECRET),
        *("--webhook-backoff-secs", "2", "--webhook-timeout-secs", "2"),
    )


def _in_progress(server: ServerProcess, response_id: str) -> None:
    client = server.client()
    deadline = time.monotonic() + 20
    while client.responses.retrieve(response_id).status != "in_progress":
        assert time.monotonic() < deadline
        time.sleep(0.02)


def test_replicas_send_each_delivery_once(
    servers: ServerProcesses, redis_server: RedisServer
) -> None:
    with receiver([500] * 4) as hook:  # retries too, taken by any replica
        flags = _flags(redis_server, key_prefix(), hook.url)
        replicas = servers.start_replicas(3, *flags)
        clients = [r.client() for r in replicas]

        def create(n: int) -> str:
            client = clients[n % 3]
            made = client.responses.create(model=MODEL, input=f"echo: job {n}", background=True)
            return str(made.id)

        with ThreadPoolExecutor(6) as pool:
            ids = set(pool.map(create, range(12)))
        hook.wait_for(16, secs=30)
        time.sleep(2.5)  # a duplicate, or a retry of a delivered one, would come by now
        hits = list(hook.hits)
    assert len(hits) == 16  # 12 deliveries and the 4 failed attempts' retries
    events = [unwrap(h) for h in hits]
    assert {e.data.id for e in events} == ids
    assert len({h.headers["webhook-id"] for h in hits}) == 12


def test_a_delivery_left_by_a_killed_replica_is_sent_by_another(
    servers: ServerProcesses, redis_server: RedisServer
) -> None:
    with receiver([500]) as hook:
        flags = _flags(redis_server, key_prefix(), hook.url)
        first = servers.start(*flags)
        job = first.client().responses.create(model=MODEL, input="echo: done", background=True)
        (failed,) = hook.wait_for(1)
        first.kill()  # its retry was 1 to 2 s away
        other = servers.start(*flags)
        _, delivered = hook.wait_for(2)
        time.sleep(1.0)
        assert len(hook.hits) == 2
    assert delivered.headers["webhook-id"] == failed.headers["webhook-id"]
    event = unwrap(delivered)
    assert event.type == "response.completed"
    assert event.data.id == job.id
    assert other.client().responses.retrieve(job.id).status == "completed"


def test_a_job_killed_in_flight_is_announced_failed_by_the_reaping_replica(
    servers: ServerProcesses, redis_server: RedisServer
) -> None:
    with receiver() as hook:
        flags = _flags(redis_server, key_prefix(), hook.url)
        other = servers.start(*flags)
        owner = servers.start(*flags, "--parallel", "1", hold="w0")
        job = owner.client().responses.create(model=MODEL, input=LONG, background=True)
        _in_progress(owner, job.id)
        owner.kill()
        (hit,) = hook.wait_for(1, secs=20)  # once the owner's lease lapses and it is reaped
        time.sleep(1.0)
        assert len(hook.hits) == 1
    event = unwrap(hit)
    assert event.type == "response.failed"
    assert event.data.id == job.id
    assert other.client().responses.retrieve(job.id).status == "failed"
    assert other.client().responses.create(model=MODEL, input="echo: fine").output_text == "fine"
