"""Replicas sharing one Redis store, for the cluster tests: three fake-engine server
processes (`server_process.py`) on one Redis under one key prefix, with a lease of 2 s,
and what the tests read from them."""

from __future__ import annotations

import itertools
import re
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import httpx
from openai import OpenAI
from openai.types.responses import Response
from pydantic import BaseModel

from redis_server import RedisServer
from server_process import ServerProcess, ServerProcesses

LEASE_SECS = 2.0
REAP_SECS = LEASE_SECS / 3
"""A replica renews its lease, and reaps, every third of the lease."""
STEP_DELAY = 0.02
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


def store_flags(redis: RedisServer, prefix: str, *extra: str) -> tuple[str, ...]:
    flags = ("--store", redis.url, "--redis-key-prefix", prefix)
    return (*flags, "--replica-lease-secs", str(LEASE_SECS), *extra)


def start_cluster(
    servers: ServerProcesses, redis: RedisServer, prefix: str, *extra: str
) -> Cluster:
    flags = store_flags(redis, prefix, *extra)
    replicas = servers.start_replicas(3, *flags, step_delay=STEP_DELAY)
    return Cluster(redis, prefix, replicas, [r.client() for r in replicas], flags)


def poll(
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


def metric(replica: ServerProcess, series: str) -> float:
    text = httpx.get(f"{replica.url}/metrics", timeout=10).text
    pattern = rf'^{re.escape(series)}(?:{{model="[^"]*"}})? (\S+)$'  # over every model
    found = re.findall(pattern, text, re.MULTILINE)
    assert found, series
    return sum(float(value) for value in found)


def texts(items: Sequence[BaseModel]) -> list[str]:
    """The text of each message item."""
    return [str(item.model_dump()["content"][0]["text"]) for item in items]


GENERATIONS = "mlxcel_response_duration_seconds_count"
"""Responses a replica's slots ran to their end (one per generation)."""
