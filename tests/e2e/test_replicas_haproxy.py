"""End to end on the real model: two replicas sharing one Redis store, behind HAProxy.

What a client sees through the one address: a stream arrives as it is generated, the
response it stored can be read back from either replica, and a `previous_response_id` turn
served by the other replica continues it."""

from __future__ import annotations

import contextlib
import time
from pathlib import Path

import httpx
import pytest
from openai import OpenAI
from prometheus_client.parser import text_string_to_metric_families

from haproxy import Haproxy
from redis_server import RedisServer
from server_process import RealServer, start_replicas

pytestmark = pytest.mark.e2e

replicas = contextlib.contextmanager(start_replicas)

RETRIEVES = 4
"""An even number: round-robin then hands the follow-up turn to the replica that did not
generate the first one."""


def _requests(server: RealServer, route: str, method: str) -> float:
    """How many `method route` requests `server` answered 200, from its own /metrics."""
    text = httpx.get(f"{server.url}/metrics", timeout=30).text
    for family in text_string_to_metric_families(text):
        if family.name in ("mlxcel_http_requests", "mlxcel_http_requests_total"):
            return sum(
                s.value
                for s in family.samples
                if s.name == "mlxcel_http_requests_total"
                and s.labels == {"route": route, "method": method, "status": "200"}
            )
    raise AssertionError(f"no mlxcel_http_requests_total on {server.url}")


def test_two_replicas_behind_haproxy_stream_store_and_chain(
    tmp_path: Path, redis_server: RedisServer, redis_prefix: str
) -> None:
    flags = ("--store", redis_server.url, "--redis-key-prefix", redis_prefix)
    flags += ("--parallel", "1")
    with replicas(tmp_path, 2, *flags) as servers, Haproxy([s.url for s in servers]) as proxy:
        client = OpenAI(
            base_url=f"{proxy.url}/v1", api_key="sk-no-auth", max_retries=0, timeout=600
        )
        with client:
            arrivals: list[tuple[str, float]] = []
            response_id = ""
            stream = client.responses.create(
                model=servers[0].alias,
                input="My name is Zorblax. Greet me by my name in one short sentence.",
                stream=True,
                max_output_tokens=24,
                temperature=0,
            )
            deltas = []
            for event in stream:
                arrivals.append((event.type, time.monotonic()))
                if event.type == "response.output_text.delta":
                    deltas.append(event.delta)
                elif event.type == "response.completed":
                    response_id = event.response.id
            streamed = "".join(deltas)

            # Incremental: several deltas, arriving apart (a
            # proxy that buffered the stream would deliver every event at once).
            kinds = [kind for kind, _ in arrivals]
            assert kinds[0] == "response.created", kinds
            assert kinds[-1] == "response.completed", kinds
            assert len(deltas) >= 4, kinds
            # A decode step takes tens of milliseconds: deltas that arrive more than a step
            # apart were not held back for the whole response.
            times = [when for kind, when in arrivals if kind == "response.output_text.delta"]
            assert times[-1] - times[0] > 0.02, times
            assert response_id.startswith("resp_")

            # Stored in Redis: every replica reads it back (round-robin reaches both).
            for _ in range(RETRIEVES):
                again = client.responses.retrieve(response_id)
                assert again.id == response_id
                assert again.status == "completed"
                assert again.output_text == streamed
            retrieve = "/v1/responses/<response_id>"
            assert [_requests(s, retrieve, "GET") for s in servers] == [RETRIEVES / 2] * 2

            # The next turn, on the other replica, continues the stored chain.
            follow = client.responses.create(
                model=servers[0].alias,
                input="What is my name? Answer with the name only.",
                previous_response_id=response_id,
                max_output_tokens=16,
                temperature=0,
            )
            assert follow.status == "completed"
            assert "zorblax" in follow.output_text.lower(), follow.output_text
            assert [_requests(s, "/v1/responses", "POST") for s in servers] == [1, 1]
