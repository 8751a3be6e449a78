"""CPU load: who used the cores during a level, and waiting for an idle machine.

Reads `/proc` (Linux); elsewhere only the benchmark's own CPU time is known.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path

OTHER_CPU_WARN_PCT = 5.0


@dataclass
class CpuSample:
    """Cumulative CPU seconds: the whole machine (busy), the server, this process."""

    busy: float | None
    server: float | None
    bench: float

    @classmethod
    def take(cls, server_pid: int | None) -> CpuSample:
        times = os.times()
        return cls(_machine_busy(), _process_cpu(server_pid), times.user + times.system)


_TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def _machine_busy() -> float | None:
    """Busy CPU seconds of all cores since boot (Linux), None elsewhere."""
    try:
        fields = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    except (OSError, ValueError):
        return None
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)  # idle + iowait
    return (sum(fields[:8]) - idle) / _TICKS


def _process_cpu(pid: int | None) -> float | None:
    """User + system CPU seconds of one process and its reaped children (Linux)."""
    if pid is None:
        return None
    try:
        rest = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return sum(int(x) for x in rest[11:15]) / _TICKS
    except (OSError, ValueError, IndexError):
        return None


def cpu_shares(before: CpuSample, after: CpuSample, wall: float) -> dict[str, float | None]:
    """Percent of all cores used by the server, the benchmark and everything else."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    capacity = wall * (cores or 1)

    def pct(a: float | None, b: float | None) -> float | None:
        return None if a is None or b is None or capacity <= 0 else 100.0 * (b - a) / capacity

    server = pct(before.server, after.server)
    bench = pct(before.bench, after.bench)
    busy = pct(before.busy, after.busy)
    other = None
    if busy is not None and bench is not None:
        other = max(0.0, busy - bench - (server or 0.0))
    return {"server_cpu_pct": server, "bench_cpu_pct": bench, "other_cpu_pct": other}


def other_cpu_pct(seconds: float = 2.0) -> float | None:
    """Percent of all cores busy over `seconds`, not counting this process."""
    before = CpuSample.take(None)
    time.sleep(seconds)
    return cpu_shares(before, CpuSample.take(None), seconds)["other_cpu_pct"]


def wait_for_idle(max_wait: float) -> float | None:
    """Wait up to `max_wait` seconds for the machine to be quiet; returns the last reading."""
    deadline = time.monotonic() + max_wait
    while True:
        busy = other_cpu_pct()
        if busy is None or busy <= OTHER_CPU_WARN_PCT:
            return busy
        if time.monotonic() >= deadline:
            print(
                f"warning: other processes keep {busy:.0f}% of the CPU busy; "
                "results will be skewed",
                flush=True,
            )
            return busy
        if max_wait > 0:
            print(f"other processes use {busy:.0f}% of the CPU; waiting ...", flush=True)
        time.sleep(3.0)
