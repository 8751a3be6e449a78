"""The concurrency sweep against one server: every level's N streams at once, a level
re-run while other processes disturbed it, the least disturbed attempt kept."""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict
from typing import Any

from clients import run_level
from load import OTHER_CPU_WARN_PCT, wait_for_idle
from report import LABELS, LevelResult, fmt
from servers import Server


def bench_level(
    server: Server,
    n: int,
    max_tokens: int,
    timeout: float,
    prompts: Callable[[int, int], list[str]],
    wait_idle: float,
    busy_retries: int,
    tried: list[dict[str, Any]],
) -> LevelResult:
    """Run one level, again (with fresh prompts) while other processes disturbed it, up to
    `busy_retries` times; every attempt's summary goes to `tried`, the least disturbed stands."""
    label = LABELS[server.kind]
    pid = server.proc.pid if server.proc is not None else None
    attempts: list[LevelResult] = []
    for attempt in range(1, busy_retries + 2):
        if wait_idle > 0:
            wait_for_idle(wait_idle)
        print(f"[{label}] N={n}: {n} streams x {max_tokens} tokens ...", flush=True)
        result = run_level(
            server.kind,
            server.base_url,
            server.model,
            prompts(n, attempt),
            max_tokens,
            timeout,
            pid,
        )
        result.attempt = attempt
        attempts.append(result)
        summary = result.summary()
        tried.append(summary)
        print_attempt(label, n, result, summary)
        time.sleep(1.0)
        other = summary["other_cpu_pct"]
        if other is None or other <= OTHER_CPU_WARN_PCT:
            break
        if attempt <= busy_retries:
            print(
                f"[{label}]   other processes used {other:.0f}% of the CPU; re-running this level",
                flush=True,
            )
        else:
            print(
                f"[{label}]   warning: other processes used {other:.0f}% of the CPU during "
                "this level; the least disturbed attempt is kept, its numbers are skewed",
                flush=True,
            )
    # The least disturbed attempt stands for the level.
    return min(attempts, key=lambda r: r.cpu.get("other_cpu_pct") or 0.0)


def print_attempt(label: str, n: int, result: LevelResult, summary: dict[str, Any]) -> None:
    """One attempt's headline (speed, errors, who used the CPU) and its failed requests."""
    print(
        f"[{label}] N={n}: {summary['wall_s']:.1f}s, {summary['agg_tok_s'] or 0:.1f} "
        f"tok/s, {summary['errors']} errors; CPU: server "
        f"{fmt(summary['server_cpu_pct'], '{:.0f}')}%, bench "
        f"{fmt(summary['bench_cpu_pct'], '{:.0f}')}%, other processes "
        f"{fmt(summary['other_cpu_pct'], '{:.0f}')}%",
        flush=True,
    )
    for r in result.requests:
        if r.error is not None:
            print(f"[{label}]   request {r.index}: {json.dumps(r.error)[:600]}", flush=True)


def bench_server(
    server: Server,
    levels: Sequence[int],
    max_tokens: int,
    timeout: float,
    prompts: Callable[[int, int], list[str]],
    wait_idle: float = 0.0,
    busy_retries: int = 0,
) -> dict[str, Any]:
    """Run every level against one server; a level disturbed by other processes is re-run
    (with fresh prompts, so no prompt cache helps) up to `busy_retries` times."""
    label = LABELS[server.kind]
    tried: list[dict[str, Any]] = []
    level_results = [
        bench_level(server, n, max_tokens, timeout, prompts, wait_idle, busy_retries, tried)
        for n in levels
    ]
    return {
        "label": label,
        "base_url": server.base_url,
        "model": server.model,
        "command": server.command,
        "blas": server.blas_line(),
        "summary": [r.summary() for r in level_results],
        "all_attempts": tried,
        "levels": [
            {
                "n": r.n,
                "wall_s": r.wall_s,
                "requests": [
                    asdict(q) | {"ttft": q.ttft, "tpot": q.tpot, "tokens_per_s": q.tokens_per_s}
                    for q in r.requests
                ],
            }
            for r in level_results
        ],
        "log_tail": server.log_tail()
        if any(s["errors"] for s in (r.summary() for r in level_results))
        else None,
    }
