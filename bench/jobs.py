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
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import openai

TERMINAL = ("completed", "incomplete", "failed", "cancelled")


def rss_mib(pid: int) -> float | None:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except OSError:
        return None
    return None


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start(jobs: int, parallel: int, log: Path) -> tuple[subprocess.Popen[bytes], str]:
    port = free_port()
    exe = Path(sys.executable).with_name("mlxcel-server")
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [str(exe), "--port", str(port), "--max-jobs", str(jobs), "--parallel", str(parallel)],
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"server exited; see {log}")
        try:
            if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                return proc, url
        except httpx.TransportError:
            pass
        time.sleep(0.5)
    proc.kill()
    raise SystemExit("server did not become healthy in 600 s")


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

    proc = None
    log = Path(__file__).with_name("results") / f"jobs-{time.strftime('%Y%m%d-%H%M%S')}.log"
    log.parent.mkdir(exist_ok=True)
    if args.url:
        url = args.url
    else:
        proc, url = start(args.jobs, args.parallel, log)
    try:
        client = openai.OpenAI(base_url=f"{url}/v1", api_key="sk-no-auth", max_retries=0)
        model = client.models.list().data[0].id
        client.responses.create(model=model, input="warm up", max_output_tokens=4)
        pid = proc.pid if proc else None
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
        if proc is not None:
            proc.terminate()
            proc.wait(timeout=30)


if __name__ == "__main__":
    sys.exit(main())
