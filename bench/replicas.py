"""Replicas benchmark: what sharing one Redis store costs and how fast it heals.

It starts a `redis-server` and three `mlxcel` server processes on the deterministic fake
engine, all on that Redis (`--store redis://...`, one key prefix per measure), and
measures over real HTTP:

- routed cancel latency: a background job runs on R1, its cancel is sent to R2 (which
  asks the owner through the store) and answers once the `cancelled` end is stored;
- dead-owner time: an owner replica is SIGKILLed mid-job, and another replica is polled
  until the job answers `failed` (at most the lease, plus the peers' reap period of a
  third of a lease); with `--replica-lease-secs 2` over several runs, and the default
  15 s once;
- lost appends: three writers, each on its own replica, add items to one conversation at
  once; every item must be there, each writer's in its order.

Run from the repository root (the machine should be idle; needs `redis-server`):

    .venv/bin/python bench/replicas.py
    .venv/bin/python bench/replicas.py --cancels 40 --kills 5 --appends 30
"""

from __future__ import annotations

import argparse
import contextlib
import json
import signal
import socket
import statistics
import subprocess
import sys
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
from machinery import redis_server

ROOT = Path(__file__).resolve().parents[1]
SERVER = """
import functools, sys
from mlxcel.cli.serve import serve_until_signalled
from mlxcel.cli.main import _serve
from mlxcel.model.fake import FakeEngine, fake_factory
from mlxcel.generation import ModelNames

step_delay = float(sys.argv[1])
def run(settings):
    factory = functools.partial(fake_factory, FakeEngine(step_delay=step_delay), 65536)
    serve_until_signalled(settings, factory, ModelNames("fake", "/fake"))
sys.exit(_serve("bench-replica", sys.argv[2:], run))
"""
MODEL = "fake"
STEP_DELAY = 0.02
LONG = "echo: " + " ".join(f"w{i}" for i in range(2000))  # 40 s at 20 ms a step
DEFAULT_LEASE_SECS = 15.0
UNFINISHED = ("queued", "in_progress")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@dataclass
class Replica:
    process: subprocess.Popen[bytes]
    url: str
    http: httpx.Client

    def kill(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGKILL)
        self.process.wait(timeout=30)
        self.http.close()

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.process.kill()
        self.http.close()


class Replicas:
    """Replica processes on one Redis store under one key prefix; `close` ends them."""

    def __init__(self, store: str, prefix: str, lease_secs: float) -> None:
        self.flags = ["--store", store, "--redis-key-prefix", prefix]
        self.flags += ["--replica-lease-secs", str(lease_secs), "--max-queue-depth", "256"]
        self.started: list[Replica] = []

    def launch(self, *extra: str) -> Replica:
        port = free_port()
        argv = [sys.executable, "-c", SERVER, str(STEP_DELAY), "--port", str(port)]
        argv += [*self.flags, *extra]
        process = subprocess.Popen(argv, cwd=ROOT, stdout=subprocess.DEVNULL)
        url = f"http://127.0.0.1:{port}"
        replica = Replica(process, url, httpx.Client(base_url=url, timeout=60))
        self.started.append(replica)
        return replica

    def start(self, count: int, *extra: str) -> list[Replica]:
        """`count` replicas started together, each answering `/health`."""
        replicas = [self.launch(*extra) for _ in range(count)]
        for replica in replicas:
            wait_healthy(replica)
        return replicas

    def close(self) -> None:
        for replica in self.started:
            replica.stop()


def wait_healthy(replica: Replica, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if replica.process.poll() is not None:
            raise RuntimeError(f"a replica exited with status {replica.process.returncode}")
        try:
            if replica.http.get("/health").status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.02)
    raise RuntimeError(f"a replica did not answer /health within {timeout} s")


@contextlib.contextmanager
def replicas(store: str, prefix: str, lease_secs: float) -> Iterator[Replicas]:
    started = Replicas(store, prefix, lease_secs)
    try:
        yield started
    finally:
        started.close()


def create(replica: Replica, text: str, **extra: Any) -> dict[str, Any]:
    r = replica.http.post("/v1/responses", json={"model": MODEL, "input": text, **extra})
    r.raise_for_status()
    body: dict[str, Any] = r.json()
    return body


def poll(replica: Replica, response_id: str, until: tuple[str, ...]) -> dict[str, Any]:
    """Retrieve until the status is one of `until` (RuntimeError on any other answer
    than 200, or after 120 s)."""
    deadline = time.monotonic() + 120
    while True:
        r = replica.http.get(f"/v1/responses/{response_id}")
        if r.status_code != 200:
            raise RuntimeError(f"polling {response_id}: {r.status_code} {r.text}")
        body: dict[str, Any] = r.json()
        if body["status"] in until:
            return body
        if time.monotonic() > deadline:
            raise RuntimeError(f"{response_id} stayed {body['status']}")
        time.sleep(0.005)


def routed_cancels(cluster: list[Replica], runs: int) -> list[float]:
    """Seconds from a cancel sent to R2 to its `cancelled` answer, for a job R1 runs."""
    owner, other = cluster[0], cluster[1]
    took: list[float] = []
    for _ in range(runs):
        job = create(owner, LONG, background=True)
        poll(other, job["id"], ("in_progress",))
        started = time.perf_counter()
        r = other.http.post(f"/v1/responses/{job['id']}/cancel")
        took.append(time.perf_counter() - started)
        if r.status_code != 200 or r.json()["status"] != "cancelled":
            raise RuntimeError(f"cancel answered {r.status_code} {r.text}")
    return took


def dead_owner_times(store: str, prefix: str, lease_secs: float, runs: int) -> list[float]:
    """Seconds from SIGKILL of a job's owner to `failed` seen on another replica."""
    took: list[float] = []
    with replicas(store, prefix, lease_secs) as started:
        peer = started.start(1)[0]
        for _ in range(runs):
            owner = started.start(1)[0]
            job = create(owner, LONG, background=True)
            poll(peer, job["id"], ("in_progress",))
            owner.kill()
            killed = time.perf_counter()
            end = poll(peer, job["id"], ("failed", "completed", "cancelled"))
            took.append(time.perf_counter() - killed)
            if end["status"] != "failed":
                raise RuntimeError(f"a dead owner's job ended {end['status']}")
    return took


def lost_appends(cluster: list[Replica], per_writer: int) -> tuple[int, int, bool]:
    """(items sent, items lost, each writer's order kept) for three writers at once."""
    r = cluster[0].http.post("/v1/conversations", json={})
    r.raise_for_status()
    conversation = r.json()["id"]

    def write(writer: int) -> None:
        for n in range(per_writer):
            item = {"type": "message", "role": "user", "content": f"w{writer}-{n}"}
            path = f"/v1/conversations/{conversation}/items"
            cluster[writer].http.post(path, json={"items": [item]}).raise_for_status()

    with ThreadPoolExecutor(len(cluster)) as pool:
        list(pool.map(write, range(len(cluster))))
    path = f"/v1/conversations/{conversation}/items?order=asc&limit=100"
    texts: list[str] = []
    after: str | None = None
    while True:
        page = cluster[1].http.get(path + (f"&after={after}" if after else "")).json()
        texts += [item["content"][0]["text"] for item in page["data"]]
        if not page["has_more"]:
            break
        after = page["last_id"]
    sent = len(cluster) * per_writer
    ordered = all(
        [t for t in texts if t.startswith(f"w{w}-")] == [f"w{w}-{n}" for n in range(per_writer)]
        for w in range(len(cluster))
    )
    return sent, sent - len(texts), ordered


def quantile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def row(name: str, values: list[float], bound: str) -> str:
    ms = [1000 * v for v in values]
    return (
        f"| {name} | {len(ms)} | {statistics.median(ms):8.0f} | {quantile(ms, 0.95):8.0f} "
        f"| {max(ms):8.0f} | {bound} |"
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cancels", type=int, default=40, help="routed cancels measured")
    parser.add_argument("--kills", type=int, default=5, help="owners killed at lease 2 s")
    parser.add_argument("--appends", type=int, default=30, help="items per writer")
    parser.add_argument("--lease-secs", type=float, default=2.0)
    parser.add_argument(
        "--skip-default-lease", action="store_true", help="no kill at the default 15 s lease"
    )
    args = parser.parse_args()
    lease = args.lease_secs
    results: dict[str, Any] = {}
    with redis_server(free_port()) as store:
        with replicas(store, "bench-main", lease) as started:
            cluster = started.start(3)
            results["cancel"] = routed_cancels(cluster, args.cancels)
            results["appends"] = lost_appends(cluster, args.appends)
        results["dead"] = dead_owner_times(store, "bench-dead", lease, args.kills)
        if not args.skip_default_lease:
            results["dead_default"] = dead_owner_times(
                store, "bench-dead-default", DEFAULT_LEASE_SECS, 1
            )
    print(f"fake engine ({1000 * STEP_DELAY:.0f} ms a step), 3 replicas on one redis-server")
    print("| measure | runs | p50 ms | p95 ms | max ms | bound |")
    print("|---|---:|---:|---:|---:|---|")
    print(row("routed cancel (R1's job, cancel on R2)", results["cancel"], "< 1000 ms"))
    bound = f"< {1000 * (lease + lease / 3):.0f} ms (lease + lease/3)"
    print(row(f"dead owner, lease {lease:g} s", results["dead"], bound))
    if "dead_default" in results:
        bound = f"< {1000 * (DEFAULT_LEASE_SECS * 4 / 3):.0f} ms (lease + lease/3)"
        print(row(f"dead owner, lease {DEFAULT_LEASE_SECS:g} s", results["dead_default"], bound))
    sent, lost, ordered = results["appends"]
    print(
        f"\nconcurrent appends: 3 writers x {args.appends} on 3 replicas: {sent} sent, "
        f"{lost} lost (expect 0), each writer's order kept: {ordered}"
    )
    print(json.dumps(results))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
