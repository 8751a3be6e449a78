"""Fake-engine server processes as replicas: started together, each answers on its own
port, and one frozen with SIGSTOP answers nothing until resumed while the others carry
on; a frozen one can still be killed. A held fake engine keeps a reply in flight until
released."""

from __future__ import annotations

import time

import httpx
import pytest

from haproxy import Haproxy
from server_process import MODEL, ServerProcesses


def test_replicas_start_together_and_one_can_be_frozen(servers: ServerProcesses) -> None:
    one, two = servers.start_replicas(2, "--parallel", "1")
    assert one.url != two.url
    one.pause()
    with pytest.raises(httpx.ReadTimeout):
        httpx.get(f"{one.url}/health", timeout=0.5)
    assert httpx.get(f"{two.url}/health", timeout=10).status_code == 200
    one.resume()
    assert httpx.get(f"{one.url}/health", timeout=10).status_code == 200
    one.pause()
    one.kill()  # SIGKILL ends a frozen process too
    assert one.proc.returncode is not None


def _health_count(url: str) -> float:
    metrics = httpx.get(f"{url}/metrics", timeout=10).text
    line = 'mlxcel_http_requests_total{method="GET",route="/health",status="200"} '
    return sum(
        float(row.removeprefix(line)) for row in metrics.splitlines() if row.startswith(line)
    )


def test_replicas_behind_haproxy_share_the_requests(servers: ServerProcesses) -> None:
    replicas = servers.start_replicas(2)
    before = [_health_count(r.url) for r in replicas]
    with Haproxy([r.url for r in replicas]) as proxy, httpx.Client(timeout=30) as http:
        for _ in range(4):
            assert http.get(f"{proxy.url}/health").status_code == 200
    assert [_health_count(r.url) - b for r, b in zip(replicas, before, strict=True)] == [2, 2]


def test_a_held_reply_stays_in_flight_until_released(servers: ServerProcesses) -> None:
    server = servers.start("--parallel", "2", hold="w0")
    client = server.client()
    held = client.responses.create(model=MODEL, input="echo: w0 w1 w2", background=True)
    assert client.responses.create(model=MODEL, input="echo: free").output_text == "free"
    time.sleep(0.5)  # no wait would end it: only the release does
    assert client.responses.retrieve(held.id).status == "in_progress"
    server.release()
    deadline = time.monotonic() + 10
    while (done := client.responses.retrieve(held.id)).status != "completed":
        assert time.monotonic() < deadline, done.status
        time.sleep(0.02)
    assert done.output_text == "w0 w1 w2"
