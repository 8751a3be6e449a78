"""Machinery benchmark: what the actors and HTTP cost per decode step, without a model.

It starts `mlxcel`'s server in a subprocess on the deterministic fake engine (its steps
cost next to nothing), opens N streaming requests at once over HTTP, and measures how
many requests, stream events and tokens per second the scheduler, builder, SSE encoder
and HTTP stack sustain. With every stream decoding, one engine step yields one token per
stream, so the wall time per token of a stream is the machinery's time per decode step;
compared with the real engine's decode step at the same batch size it says what share of
a step the machinery costs.

Each response is stored (`store` defaults to true), so the store backend is on every
request's path: `--store` picks the server's (`memory`; `sqlite` on a new file in a
temporary directory per run, or `sqlite:PATH`; `redis` on a new `redis-server` started
for the run, or `redis://...`), and `--compare-store [STORE]` runs the levels on memory
and on STORE (default sqlite), alternating `--rounds` times, and prints STORE's
throughput as a share of memory's (the median of the rounds for each).

Run from the repository root (the machine should be idle):

    .venv/bin/python bench/machinery.py                     # levels 1,8,32,64
    .venv/bin/python bench/machinery.py --step-ms 980        # the real step to compare with
    .venv/bin/python bench/machinery.py --store sqlite       # on a durable store
    .venv/bin/python bench/machinery.py --compare-store --rounds 3
    .venv/bin/python bench/machinery.py --compare-store redis --rounds 3
"""

from __future__ import annotations

import argparse
import contextlib
import json
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import trio

ROOT = Path(__file__).resolve().parents[1]
SERVER = """
import functools, sys, trio
from mlxcel.app import serve
from mlxcel.config import Settings
from mlxcel.generation import ModelNames
from mlxcel.model.fake import FakeEngine, fake_factory

from mlxcel.config import StoreLimits

port, parallel, store = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
entries, budget = int(sys.argv[4]), int(sys.argv[5])
responses = StoreLimits(entries, budget, 3600)
settings = Settings(
    port=port, parallel=parallel, max_queue_depth=1024, store=store, responses=responses
)
factory = functools.partial(fake_factory, FakeEngine(), 65536)
trio.run(functools.partial(serve, settings, factory, ModelNames("fake", "/fake")))
"""
# The real engine's decode step at batch 64 on the default model (float32, 2 cores):
# ~65 tok/s decode-only in mlx-lm's `batch_generate`, so ~980 ms per step.
DEFAULT_STEP_MS = 980.0
DEFAULT_ENTRIES, DEFAULT_BYTES = 1024, 268_435_456
"""The server's own response store limits (`--responses-store-max-*`)."""


async def one_stream(http: httpx.AsyncClient, tokens: int) -> tuple[float, int]:
    """(seconds, stream events) of one streamed response of `tokens` tokens."""
    words = " ".join(f"w{i}" for i in range(tokens))
    body = {"model": "fake", "input": f"echo: {words}", "stream": True}
    started = time.perf_counter()
    events = 0
    async with http.stream("POST", "/v1/responses", json=body) as response:
        response.raise_for_status()
        async for line in response.aiter_lines():
            events += line.startswith("data: ")
    return time.perf_counter() - started, events


async def level(url: str, streams: int, tokens: int) -> dict[str, float]:
    durations: list[float] = []
    events: list[int] = []
    limits = httpx.Limits(max_connections=streams + 1)
    async with httpx.AsyncClient(base_url=url, timeout=600, limits=limits) as http:

        async def run() -> None:
            seconds, count = await one_stream(http, tokens)
            durations.append(seconds)
            events.append(count)

        started = time.perf_counter()
        async with trio.open_nursery() as nursery:
            for _ in range(streams):
                nursery.start_soon(run)
        wall = time.perf_counter() - started
    step_ms = 1000 * statistics.median(durations) / tokens
    return {
        "streams": streams,
        "wall_s": wall,
        "requests_per_s": streams / wall,
        "events_per_s": sum(events) / wall,
        "tokens_per_s": streams * tokens / wall,
        "step_ms": step_ms,
    }


@contextlib.contextmanager
def server(
    port: int,
    parallel: int,
    store: str,
    entries: int = DEFAULT_ENTRIES,
    max_bytes: int = DEFAULT_BYTES,
) -> Iterator[str]:
    """The server on the fake engine, answering `/health`, for the block; its URL.

    `store` is the server's `--store`; a bare `sqlite` is a new file in a temporary
    directory, removed after; a bare `redis` a new redis-server, stopped after."""
    with contextlib.ExitStack() as stack:
        if store == "sqlite":
            folder = stack.enter_context(tempfile.TemporaryDirectory(prefix="mlxcel-bench-"))
            store = f"sqlite:{folder}/store.sqlite3"
        if store == "redis":
            store = stack.enter_context(redis_server(port + 1))
        argv = [str(port), str(parallel), store, str(entries), str(max_bytes)]
        process = subprocess.Popen([sys.executable, "-c", SERVER, *argv], cwd=ROOT)
        url = f"http://127.0.0.1:{port}"
        try:
            wait_healthy(url, process)
            yield url
        finally:
            process.terminate()
            process.wait(timeout=30)


@contextlib.contextmanager
def redis_server(port: int) -> Iterator[str]:
    """A `redis-server` on loopback `port` as the docs run it (append-only file, no
    eviction), in a temporary directory, for the block; its URL."""
    with tempfile.TemporaryDirectory(prefix="mlxcel-bench-redis-") as folder:
        flags = ["--bind", "127.0.0.1", "--port", str(port), "--dir", folder, "--save", ""]
        flags += ["--appendonly", "yes", "--maxmemory-policy", "noeviction"]
        process = subprocess.Popen(["redis-server", *flags], stdout=subprocess.DEVNULL)
        try:
            deadline = time.monotonic() + 30
            while True:
                with (
                    contextlib.suppress(OSError),
                    socket.create_connection(("127.0.0.1", port)) as s,
                ):
                    s.sendall(b"PING\r\n")
                    if s.recv(16).startswith(b"+PONG"):
                        break
                if process.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError("redis-server did not start")
                time.sleep(0.02)
            yield f"redis://127.0.0.1:{port}/0"
        finally:
            process.terminate()
            process.wait(timeout=30)


def wait_healthy(url: str, process: subprocess.Popen[bytes], timeout: float = 60) -> None:
    """Return once `url` answers `/health` with 200; RuntimeError if the server exits or
    does not answer in time."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"the server exited with status {process.returncode}")
        try:
            if httpx.get(f"{url}/health").status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.02)
    raise RuntimeError(f"the server did not answer /health within {timeout} s")


def run_levels(port: int, store: str, levels: list[int], tokens: int) -> list[dict[str, float]]:
    with server(port, max(levels), store) as url:
        return [trio.run(level, url, n, tokens) for n in levels]


def print_levels(results: list[dict[str, float]], step_ms: float) -> None:
    print("|  N | requests/s | events/s | tokens/s | machinery ms/step | share of a step |")
    print("|---:|-----------:|---------:|---------:|------------------:|----------------:|")
    for r in results:
        share = 100 * r["step_ms"] / step_ms
        print(
            f"| {r['streams']:>2} | {r['requests_per_s']:10.1f} | {r['events_per_s']:8.0f} "
            f"| {r['tokens_per_s']:8.0f} | {r['step_ms']:17.2f} | {share:14.1f}% |"
        )


TARGETS = {"sqlite": 95, "redis": 90}
"""The least share of memory's throughput each store is to keep (its issue's target)."""


def compare_stores(args: argparse.Namespace, levels: list[int]) -> None:
    """Each level on `memory` and on `args.compare_store`, alternating `args.rounds`
    times; the median tokens/s of each, and the other's as a share of memory's."""
    other = args.compare_store
    rounds: dict[str, list[list[dict[str, float]]]] = {"memory": [], other: []}
    for _ in range(args.rounds):
        for store in rounds:
            rounds[store].append(run_levels(args.port, store, levels, args.tokens))
    target = TARGETS.get(other.split(":")[0], 95)
    print(f"fake engine, {args.tokens} tokens per stream; median of {args.rounds} round(s)")
    print(f"|  N | memory tokens/s | {other} tokens/s | {other}/memory | target |")
    print("|---:|----------------:|----------------:|--------------:|-------:|")
    for at, n in enumerate(levels):
        memory = statistics.median(r[at]["tokens_per_s"] for r in rounds["memory"])
        theirs = statistics.median(r[at]["tokens_per_s"] for r in rounds[other])
        print(
            f"| {n:>2} | {memory:15.0f} | {theirs:15.0f} | {100 * theirs / memory:12.1f}% "
            f"| >= {target}% |"
        )
    print(json.dumps(rounds))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--levels", default="1,8,32,64")
    parser.add_argument("--tokens", type=int, default=256, help="tokens per stream")
    parser.add_argument("--step-ms", type=float, default=DEFAULT_STEP_MS)
    parser.add_argument("--port", type=int, default=18931)
    parser.add_argument(
        "--store",
        default="memory",
        help="the server's --store: memory, sqlite (a new temporary file), sqlite:PATH, "
        "redis (a new redis-server) or redis://...",
    )
    parser.add_argument(
        "--compare-store",
        nargs="?",
        const="sqlite",
        default=None,
        metavar="STORE",
        help="run on memory and on STORE (default sqlite), side by side",
    )
    parser.add_argument(
        "--rounds", type=int, default=1, help="with --compare-store: alternations of the two"
    )
    args = parser.parse_args()
    levels = [int(n) for n in args.levels.split(",")]
    if args.compare_store:
        compare_stores(args, levels)
        return 0
    results = run_levels(args.port, args.store, levels, args.tokens)
    print(
        f"fake engine, {args.tokens} tokens per stream, --store {args.store}; "
        f"real decode step {args.step_ms} ms"
    )
    print_levels(results, args.step_ms)
    print(json.dumps(results))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
