"""Resuming a background response's stream across replicas sharing one Redis store: a
stream read on the replica running the job and dropped resumes on another, through
HAProxy too, and a killed owner's log is ended by the replica that serves the reader."""

from __future__ import annotations

import threading
import time

import httpx
from openai import OpenAI
from replica_cluster import LEASE_SECS, Cluster, poll
from resume_support import frames

from haproxy import Haproxy
from server_process import MODEL, ServerProcess
from support import LONG

WORDS = "echo: " + " ".join(f"w{i}" for i in range(80))  # 80 steps of 20 ms: 1.6 s


def _events(url: str, response_id: str, **params: str) -> bytes:
    r = httpx.get(
        f"{url}/v1/responses/{response_id}", params={"stream": "true", **params}, timeout=60
    )
    assert r.status_code == 200, r.text
    return r.content


def _break_after(client: OpenAI, response_id: str, last: int) -> list[int]:
    seen = []
    with client.responses.retrieve(response_id, stream=True) as stream:
        for event in stream:
            seen.append(event.sequence_number)
            if event.sequence_number == last:
                break
    return seen


def test_a_stream_started_on_one_replica_resumes_on_another(cluster: Cluster) -> None:
    a, b, c = cluster.clients
    job = a.responses.create(model=MODEL, input=WORDS, background=True)
    assert _break_after(a, job.id, 7) == list(range(8))
    numbers, final = [], None
    with b.responses.retrieve(job.id, stream=True, starting_after=7) as stream:
        for event in stream:
            numbers.append(event.sequence_number)
            final = event
    assert numbers == list(range(8, 8 + len(numbers)))
    assert final is not None
    assert final.type == "response.completed"
    retrieved = c.responses.retrieve(job.id)
    assert final.response.model_dump() == retrieved.model_dump()  # type: ignore[union-attr]
    assert retrieved.status == "completed"
    full = frames(_events(cluster.replicas[2].url, job.id))
    assert frames(_events(cluster.replicas[1].url, job.id, starting_after="7")) == full[8:]
    assert len(full) == numbers[-1] + 1


def test_resumes_through_haproxy_read_the_same_bytes_on_every_replica(cluster: Cluster) -> None:
    job = cluster.clients[0].responses.create(model=MODEL, input=WORDS, background=True)
    bodies: dict[int, bytes] = {}

    def resume(after: int) -> None:
        bodies[after] = _events(proxy.url, job.id, starting_after=str(after))

    with Haproxy([replica.url for replica in cluster.replicas]) as proxy:
        client = OpenAI(base_url=f"{proxy.url}/v1", api_key="sk-no-auth", max_retries=0)
        with client:
            assert _break_after(client, job.id, 30) == list(range(31))  # the job runs on
        threads = [threading.Thread(target=resume, args=(n,)) for n in range(0, 31, 2)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=60)
    assert cluster.clients[1].responses.retrieve(job.id).status == "completed"
    full = frames(_events(cluster.replicas[0].url, job.id))
    assert len(bodies) == len(threads)
    for after, body in bodies.items():
        assert frames(body) == full[after + 1 :], after


def test_a_killed_owners_log_ends_as_the_reaping_replica_ended_it(
    cluster: Cluster, owner: ServerProcess
) -> None:
    _, b, c = cluster.clients
    job = owner.client().responses.create(model=MODEL, input=LONG, background=True)
    poll(b, job.id, ("in_progress",))
    types: list[str] = []
    finals = []

    def follow() -> None:
        with b.responses.retrieve(job.id, stream=True) as stream:
            for event in stream:
                types.append(event.type)
                finals.append(event)

    reader = threading.Thread(target=follow)
    reader.start()
    deadline = time.monotonic() + 10
    while "response.output_text.delta" not in types:
        assert time.monotonic() < deadline, types
        time.sleep(0.01)
    owner.kill()
    reader.join(timeout=LEASE_SECS * 2 + 15)
    assert not reader.is_alive()
    assert types[-1] == "response.failed"
    retrieved = c.responses.retrieve(job.id)
    assert retrieved.status == "failed"
    assert finals[-1].response.model_dump() == retrieved.model_dump()
    assert len(frames(_events(cluster.replicas[2].url, job.id))) == len(types)
