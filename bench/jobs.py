"""A storm of background jobs: every job ends, none is lost, memory comes back.

Starts `mlxcel-server --max-jobs N` (or uses `--url`), records the server's resident
memory, submits N background jobs at once, checks that one more is refused with 429,
polls every job to a terminal state, and prints the status counts, the time taken and
the server's memory before, at the peak and after. A benchmark, not a test: it asserts
nothing and prints figures.

    .venv/bin/python bench/jobs.py                  # 64 jobs against a fresh server
    .venv/bin/python bench/jobs.py --jobs 16 --max-tokens 32
"""

from __future__ import annotations

import argparse
import collections
import sys
import time
from pathlib import Path

import openai
from servers import (
    Server,
    ServerStartError,
    free_port,
    handle_stop_signals,
    start_server,
    stop_server,
    wait_healthy,
)

TERMINAL = ("completed", "incomplete", "failed", "cancelled")
STARTUP_TIMEOUT = 600.0


def rss_mib(pid: int) -> float | None:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except OSError:
        return None
    return None


def start(jobs: int, parallel: int, log: Path) -> Server:
    """A fresh server on the default model, healthy and warmed up."""
    port = free_port()
    exe = Path(sys.executable).with_name("mlxcel-server")
    command = [str(exe), "--port", str(port), "--max-jobs", str(jobs), "--parallel", str(parallel)]
    try:
        return start_server("ours", command, port, None, log, STARTUP_TIMEOUT)
    except ServerStartError as exc:
        raise SystemExit(f"{exc}\nfull log: {log}") from exc


def attach(url: str) -> Server:
    """An already running server, healthy and warmed up."""
    server = Server("ours", url.rstrip("/"), "")
    try:
        wait_healthy(server, STARTUP_TIMEOUT)
    except ServerStartError as exc:
        raise SystemExit(str(exc)) from exc
    return server


def storm(client: openai.OpenAI, model: str, jobs: int, max_tokens: int) -> tuple[list[str], bool]:
    ids = []
    for i in range(jobs):
        job = client.responses.create(
            model=model,
            input=f"Write one sentence about the number {i}.",
            max_output_tokens=max_tokens,
            background=True,
        )
        ids.append(job.id)
    try:
        client.responses.create(
            model=model, input="one too many", background=True, max_output_tokens=max_tokens
        )
        refused = False
    except openai.RateLimitError:
        refused = True
    return ids, refused


def poll(
    client: openai.OpenAI, ids: list[str], pid: int | None, timeout: float
) -> tuple[dict[str, str], float]:
    done: dict[str, str] = {}
    peak = 0.0
    deadline = time.monotonic() + timeout
    while len(done) < len(ids) and time.monotonic() < deadline:
        for response_id in ids:
            if response_id not in done:
                resp = client.responses.retrieve(response_id)
                if resp.status in TERMINAL:
                    done[response_id] = resp.status
        if pid is not None:
            peak = max(peak, rss_mib(pid) or 0.0)
        time.sleep(0.5)
    return done, peak


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, default=64)
    parser.add_argument("--parallel", type=int, default=16)
    parser.add_argument("--max-tokens", type=int, default=16)
    parser.add_argument("--url", help="an already running server (memory is then not read)")
    parser.add_argument("--timeout", type=float, default=1800)
    args = parser.parse_args()

    log = Path(__file__).with_name("results") / f"jobs-{time.strftime('%Y%m%d-%H%M%S')}.log"
    log.parent.mkdir(exist_ok=True)
    handle_stop_signals()
    server = attach(args.url) if args.url else start(args.jobs, args.parallel, log)
    try:
        client = openai.OpenAI(
            base_url=f"{server.base_url}/v1", api_key="sk-no-auth", max_retries=0
        )
        model = server.model
        pid = server.proc.pid if server.proc else None
        before = rss_mib(pid) if pid else None
        started = time.monotonic()
        ids, refused = storm(client, model, args.jobs, args.max_tokens)
        done, peak = poll(client, ids, pid, args.timeout)
        elapsed = time.monotonic() - started
        time.sleep(2)
        after = rss_mib(pid) if pid else None
        counts = collections.Counter(done.values())
        print(f"jobs submitted:      {len(ids)}")
        print(f"one more refused:    {'429' if refused else 'NO (accepted)'}")
        print(f"reached terminal:    {len(done)} ({dict(counts)})")
        print(f"lost or stuck:       {len(ids) - len(done)}")
        print(f"time to drain:       {elapsed:.1f} s")
        if before is not None:
            print(
                f"server RSS (MiB):    before {before:.0f}, peak {peak:.0f}, "
                f"after {after:.0f} ({(after or 0) - before:+.0f})"
            )
        return 0 if len(done) == len(ids) else 1
    finally:
        stop_server(server)


if __name__ == "__main__":
    sys.exit(main())
