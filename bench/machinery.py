"""Machinery benchmark: what the actors and HTTP cost per decode step, without a model.

It starts `mlxcel`'s server in a subprocess on the deterministic fake engine (its steps
cost next to nothing), opens N streaming requests at once over HTTP, and measures how
many requests, stream events and tokens per second the scheduler, builder, SSE encoder
and HTTP stack sustain. With every stream decoding, one engine step yields one token per
stream, so the wall time per token of a stream is the machinery's time per decode step;
compared with the real engine's decode step at the same batch size it says what share of
a step the machinery costs.

Run from the repository root (the machine should be idle):

    .venv/bin/python bench/machinery.py                     # levels 1,8,32,64
    .venv/bin/python bench/machinery.py --step-ms 980        # the real step to compare with
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

import httpx
import trio

ROOT = Path(__file__).resolve().parents[1]
SERVER = """
import functools, sys, trio
from mlxcel.app import serve
from mlxcel.config import Settings
from mlxcel.prepare.intake import ModelNames
from mlxcel.model.fake import FakeEngine, fake_factory

port, parallel = int(sys.argv[1]), int(sys.argv[2])
settings = Settings(port=port, parallel=parallel, max_queue_depth=1024)
factory = functools.partial(fake_factory, FakeEngine(), 65536)
trio.run(functools.partial(serve, settings, factory, ModelNames("fake", "/fake")))
"""
# The real engine's decode step at batch 64 on the default model (float32, 2 cores):
# ~65 tok/s decode-only in mlx-lm's `batch_generate`, so ~980 ms per step.
DEFAULT_STEP_MS = 980.0


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


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--levels", default="1,8,32,64")
    parser.add_argument("--tokens", type=int, default=256, help="tokens per stream")
    parser.add_argument("--step-ms", type=float, default=DEFAULT_STEP_MS)
    parser.add_argument("--port", type=int, default=18931)
    args = parser.parse_args()
    levels = [int(n) for n in args.levels.split(",")]
    server = subprocess.Popen(
        [sys.executable, "-c", SERVER, str(args.port), str(max(levels))], cwd=ROOT
    )
    url = f"http://127.0.0.1:{args.port}"
    try:
        for _ in range(300):
            try:
                if httpx.get(f"{url}/health").status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            time.sleep(0.1)
        results = [trio.run(level, url, n, args.tokens) for n in levels]
    finally:
        server.terminate()
        server.wait(timeout=30)
    print(f"fake engine, {args.tokens} tokens per stream; real decode step {args.step_ms} ms")
    print("|  N | requests/s | events/s | tokens/s | machinery ms/step | share of a step |")
    print("|---:|-----------:|---------:|---------:|------------------:|----------------:|")
    for r in results:
        share = 100 * r["step_ms"] / args.step_ms
        print(
            f"| {r['streams']:>2} | {r['requests_per_s']:10.1f} | {r['events_per_s']:8.0f} "
            f"| {r['tokens_per_s']:8.0f} | {r['step_ms']:17.2f} | {share:14.1f}% |"
        )
    print(json.dumps(results))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
