"""A soak on the real model: minutes of mixed, misbehaving clients; nothing lost or stuck.

Starts this checkout's server on the default model and for `--minutes` keeps `--jobs`
background jobs (polled, or cancelled at a random moment) and `--streams` streaming
clients (reading to the end, hanging up, stalling, or cancelling) busy at once. Then it
waits for every response to end, for every slot to be free, and stops the server with
SIGTERM. It prints figures and asserts nothing per request, but exits 1 when a response
was lost or stuck, a 5xx other than a full queue's 503 (or a failed response) was seen,
a slot was still taken at the end, or the server did not exit 0.

    .venv/bin/python bench/soak.py --minutes 1       # a quick look
    .venv/bin/python bench/soak.py                   # 5 minutes
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import httpx
import openai
from jobs import rss_mib
from load import CpuSample, cpu_shares
from servers import (
    Server,
    ServerStartError,
    free_port,
    handle_stop_signals,
    start_server,
    stop_server,
)
from soak_clients import OUTCOMES, Soak, job_client, stream_client

HOST = "127.0.0.1"
STARTUP_TIMEOUT = 600.0
SLOTS_TIMEOUT = 60.0
CHECKOUT = Path(__file__).resolve().parents[1]


@dataclass
class Samples:
    rss_peak: float = 0.0
    busy_peak: int = 0
    queued_peak: int = 0
    cpu: dict[str, float | None] | None = None
    """Percent of all cores used by the server, the soak's clients and everything else."""


def server_command(args: argparse.Namespace, port: int) -> list[str]:
    """`mlxcel-server` from this checkout (`python -m mlxcel serve` takes the same flags)."""
    if CHECKOUT.name == "mlxcel":  # the checkout is the package: its parent goes on the path
        path = os.environ.get("PYTHONPATH")
        os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(CHECKOUT.parent), path]))
    flags = {
        "--host": HOST,
        "--port": port,
        "--parallel": args.parallel,
        "--max-queue-depth": args.max_queue_depth,
        "--max-jobs": args.jobs,
        "--send-timeout-secs": args.send_timeout,
        "--shutdown-timeout-secs": args.shutdown_timeout,
        "--responses-store-max-entries": 100_000,  # nothing is evicted during the soak
    }
    command = [sys.executable, "-m", "mlxcel", "serve"]
    for flag, value in flags.items():
        command += [flag, str(value)]
    return command


async def sample(server: Server, pid: int, samples: Samples, stop: asyncio.Event) -> None:
    """The server's memory and slot use, once a second."""
    async with httpx.AsyncClient(base_url=server.base_url, timeout=10.0) as http:
        while not stop.is_set():
            samples.rss_peak = max(samples.rss_peak, rss_mib(pid) or 0.0)
            try:
                slots = (await http.get("/health")).json()["slots"]
                samples.busy_peak = max(samples.busy_peak, slots["busy"])
                samples.queued_peak = max(samples.queued_peak, slots["queued"])
            except (httpx.HTTPError, ValueError, KeyError):
                pass
            await asyncio.sleep(1.0)


async def slots_free(base_url: str) -> tuple[int, int, float]:
    """Poll /health until no slot is busy and nothing is queued: (free, total, seconds)."""
    started = time.monotonic()
    free, total = 0, -1
    async with httpx.AsyncClient(base_url=base_url, timeout=10.0) as http:
        while True:
            try:
                slots = (await http.get("/health")).json()["slots"]
                total = slots["total"]
                free = total - slots["busy"] if slots["queued"] == 0 else 0
            except (httpx.HTTPError, ValueError, KeyError):
                pass
            waited = time.monotonic() - started
            if free == total or waited > SLOTS_TIMEOUT:
                return free, total, waited
            await asyncio.sleep(0.5)


async def soak(
    server: Server, args: argparse.Namespace, pid: int, samples: Samples
) -> tuple[Soak, tuple[int, int, float], float]:
    port = int(server.base_url.rsplit(":", 1)[1])
    timeout = httpx.Timeout(60.0, read=None)  # a queued stream is silent for minutes
    limits = httpx.Limits(max_connections=None, max_keepalive_connections=256)
    async with (
        httpx.AsyncClient(base_url=server.base_url, timeout=timeout, limits=limits) as http,
        openai.AsyncOpenAI(
            base_url=f"{server.base_url}/v1",
            api_key="sk-no-auth",
            max_retries=0,
            timeout=openai.Timeout(60.0, read=None),
        ) as api,
    ):
        cpu = CpuSample.take(pid)
        started = time.monotonic()
        end = started + args.minutes * 60
        s = Soak(
            HOST, port, server.model, end, end + args.drain_timeout, api, http, args.send_timeout
        )
        stop = asyncio.Event()
        sampler = asyncio.create_task(sample(server, pid, samples, stop))
        async with asyncio.TaskGroup() as clients:
            for i in range(args.jobs):
                clients.create_task(job_client(s, args.seed * 1000 + i))
            for i in range(args.streams):
                clients.create_task(stream_client(s, args.seed * 1000 + 500 + i))
        elapsed = time.monotonic() - started
        samples.cpu = cpu_shares(cpu, CpuSample.take(pid), elapsed)
        free = await slots_free(server.base_url)
        stop.set()
        await sampler
    return s, free, elapsed


def terminate(server: Server, timeout: float) -> tuple[int | None, float]:
    """SIGTERM the server and time its drain: (exit code or None if it hung, seconds)."""
    assert server.proc is not None
    started = time.monotonic()
    server.proc.send_signal(signal.SIGTERM)
    try:
        code: int | None = server.proc.wait(timeout)
    except subprocess.TimeoutExpired:
        code = None
    return code, time.monotonic() - started


def table(s: Soak) -> str:
    kinds = sorted({kind for kind, _ in s.tally.counts})
    always = ("503", "429", "5xx", "lost", "stuck")
    columns = [o for o in OUTCOMES if o in always or s.tally.total(o)]
    rows = [["kind", "sent", *columns]]
    for kind in [*kinds, "total"]:
        counts = [
            sum(n for (k, o), n in s.tally.counts.items() if o == c and kind in (k, "total"))
            for c in OUTCOMES
        ]
        shown = [counts[OUTCOMES.index(c)] for c in columns]
        rows.append([kind, str(sum(counts)), *map(str, shown)])
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    lines = [
        "  ".join(
            cell.ljust(w) if i == 0 else cell.rjust(w)
            for i, (cell, w) in enumerate(zip(row, widths, strict=True))
        )
        for row in rows
    ]
    return "\n".join(lines)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--minutes", type=float, default=5.0)
    parser.add_argument("--jobs", type=int, default=64, help="background job clients")
    parser.add_argument("--streams", type=int, default=32, help="streaming clients")
    parser.add_argument("--parallel", type=int, default=8)
    parser.add_argument("--max-queue-depth", type=int, default=256)
    parser.add_argument("--send-timeout", type=float, default=5.0)
    parser.add_argument("--shutdown-timeout", type=float, default=30.0)
    parser.add_argument(
        "--drain-timeout",
        type=float,
        default=900.0,
        help="seconds after the soak for every response to end",
    )
    parser.add_argument("--seed", type=int, default=1)
    return parser


@dataclass
class Ending:
    """What a soak ended with: its clients' tally, the slots, the server's memory and exit."""

    soak: Soak
    samples: Samples
    slots: tuple[int, int, float]
    """Slots free, slots in all, and the seconds waited for them to free up."""
    elapsed: float
    rss_before: float
    rss_after: float
    code: int | None
    drain: float
    log: Path


def run(args: argparse.Namespace) -> Ending:
    """Start the server, soak it, wait for its slots, then SIGTERM it; it is always stopped."""
    log = Path(__file__).with_name("results") / f"soak-{time.strftime('%Y%m%d-%H%M%S')}.log"
    handle_stop_signals()
    port = free_port()
    try:
        server = start_server("ours", server_command(args, port), port, None, log, STARTUP_TIMEOUT)
    except ServerStartError as exc:
        raise SystemExit(f"{exc}\nfull log: {log}") from exc
    try:
        assert server.proc is not None
        pid = server.proc.pid
        before = rss_mib(pid) or 0.0
        samples = Samples(rss_peak=before)
        s, slots, elapsed = asyncio.run(soak(server, args, pid, samples))
        time.sleep(2)
        after = rss_mib(pid) or 0.0
        code, drain = terminate(server, args.shutdown_timeout + 30)
    finally:
        stop_server(server)
    return Ending(s, samples, slots, elapsed, before, after, code, drain, log)


def report(args: argparse.Namespace, e: Ending) -> bool:
    """Print the figures; true when nothing was lost, stuck or failed, every slot was free
    and the server exited 0."""
    log_errors = sum(
        " ERROR " in line or "Traceback" in line
        for line in e.log.read_text(errors="replace").splitlines()
    )
    s, samples, (free, total, waited) = e.soak, e.samples, e.slots
    tally = s.tally
    lost, stuck = tally.total("lost"), tally.total("stuck")
    failures = tally.total("5xx") + tally.total("failed") + tally.total("error")
    print(
        f"\nsoak: {args.minutes:g} min of load, {e.elapsed:.0f} s until every client ended; "
        f"{args.jobs} job clients, {args.streams} stream clients, --parallel {args.parallel}, "
        f"send timeout {args.send_timeout:g} s\n"
    )
    print(table(s))
    print(f"\ncancel POSTs answered:  {dict(tally.cancels)}")
    print(f"stalled streams:        {dict(tally.stalls)}")
    print(f"lost:                   {lost}")
    print(f"stuck:                  {stuck}")
    print(
        f"5xx / failed / errors:  {tally.total('5xx')} / {tally.total('failed')} / {tally.total('error')}"
    )
    print(f"503 queue full / 429:   {tally.total('503')} / {tally.total('429')}")
    print(f"slots free at end:      {free}/{total} (after {waited:.1f} s)")
    print(f"peak busy / queued:     {samples.busy_peak} / {samples.queued_peak}")
    print(
        f"server RSS (MiB):       before {e.rss_before:.0f}, peak {samples.rss_peak:.0f}, "
        f"after {e.rss_after:.0f} ({e.rss_after - e.rss_before:+.0f})"
    )
    names = {"server_cpu_pct": "server", "bench_cpu_pct": "clients", "other_cpu_pct": "other"}
    shares = {names[k]: v for k, v in (samples.cpu or {}).items()}
    print("CPU (% of all cores):   " + ", ".join(f"{k} {v or 0:.0f}" for k, v in shares.items()))
    print(f"server log errors:      {log_errors} (log: {e.log})")
    hung = "did not exit" if e.code is None else f"exit code {e.code}"
    print(f"SIGTERM:                {hung} after {e.drain:.1f} s")
    for problem in tally.problems[:30]:
        print(f"  {problem}")
    if len(tally.problems) > 30:
        print(f"  ... and {len(tally.problems) - 30} more")
    return lost == stuck == failures == 0 and free == total and e.code == 0


def main() -> int:
    args = build_parser().parse_args()
    return 0 if report(args, run(args)) else 1


if __name__ == "__main__":
    sys.exit(main())
