"""Streaming benchmark: mlxcel-server against mlx_lm.server on the same model folder.

For every concurrency level N it fires N streaming requests at once (one thread per
client, official `openai` SDK), measures time to first token, inter-token latency, time
per output token and throughput, prints one table per server plus a ratio table, and
writes the raw numbers to `bench/results/<timestamp>.json` (and PNG plots when
matplotlib is importable). See bench/README.md for the metric definitions.

Run from the repository root:

    .venv/bin/python bench/serve.py                  # both servers, levels 1,4,16,64
    .venv/bin/python bench/serve.py --levels 1,4 --only ours
    .venv/bin/python bench/serve.py --levels '' --long-level   # the long-prompt level alone

The two servers are started one after the other, never together, and always stopped.

This file holds the command line and the sweep; the parts live next to it: servers.py
(starting, checking and stopping the servers), clients.py (the streaming requests),
prompts.py, load.py (CPU readings), report.py (statistics, tables, plots) and
long_prompt.py (the long-prompt level).
"""

from __future__ import annotations

import argparse
import importlib
import json
import re
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict
from datetime import datetime
from pathlib import Path
from typing import Any

import httpx
from clients import Kind, run_level
from load import OTHER_CPU_WARN_PCT, wait_for_idle
from long_prompt import LongConfig, add_options, bench_long, config_from, long_ratios, print_long
from prompts import PREFIX, PROMPT_TOKENS, TokenCounter, make_long_prompt, make_prompt
from report import LevelResult, fmt, machine, plot, ratio_table, ratios, server_table
from servers import Server, ServerStartError, handle_stop_signals, running, server_factory

BENCH_DIR = Path(__file__).resolve().parent
RESULTS_DIR = BENCH_DIR / "results"
DEFAULT_LEVELS = (1, 4, 16, 64)


def parse_levels(text: str) -> list[int]:
    try:
        levels = [int(x) for x in text.split(",") if x.strip()]
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"--levels {text!r}: comma-separated integers") from exc
    if any(n < 1 for n in levels):
        raise argparse.ArgumentTypeError("--levels needs positive integers, e.g. 1,4,16,64")
    return levels


def default_model_dir() -> Path | None:
    try:
        fetch = importlib.import_module("mlxcel.model.provision.fetch")
    except ImportError:
        return None
    return Path(fetch.default_model_dir())


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="bench/serve.py",
        description="Streaming latency/throughput benchmark: mlxcel-server vs mlx_lm.server.",
    )
    p.add_argument(
        "--model",
        type=Path,
        default=None,
        help="MLX model folder served by both (default: the embedded default model)",
    )
    p.add_argument(
        "--levels",
        type=parse_levels,
        default=list(DEFAULT_LEVELS),
        help="comma-separated concurrency levels (default: 1,4,16,64; '' for none)",
    )
    p.add_argument(
        "--max-tokens", type=int, default=64, help="max output tokens per request (default: 64)"
    )
    p.add_argument("--only", choices=("ours", "peer"), default=None, help="bench one server only")
    p.add_argument(
        "--our-url", default=None, help="bench an already running mlxcel server at this base URL"
    )
    p.add_argument(
        "--peer-url", default=None, help="bench an already running mlx_lm.server at this base URL"
    )
    p.add_argument(
        "--parallel",
        type=int,
        default=None,
        help="our --parallel and the peer's --decode-concurrency (default: the largest level)",
    )
    p.add_argument(
        "--prompt-concurrency",
        type=int,
        default=None,
        help="the peer's --prompt-concurrency (default: min(parallel, 8), "
        "matching our prefill batch)",
    )
    p.add_argument(
        "--timeout", type=float, default=600.0, help="seconds allowed for each level (default: 600)"
    )
    p.add_argument(
        "--startup-timeout",
        type=float,
        default=600.0,
        help="seconds allowed for a server to load and answer (default: 600)",
    )
    p.add_argument(
        "--wait-idle",
        type=float,
        default=0.0,
        help="before starting each server and each level, wait up to this many seconds for other "
        f"processes to use under {OTHER_CPU_WARN_PCT:.0f}%% of the CPU (default: 0, only warn)",
    )
    p.add_argument(
        "--busy-retries",
        type=int,
        default=0,
        help="re-run a level (with fresh prompts) up to this many times when other processes "
        f"used over {OTHER_CPU_WARN_PCT:.0f}%% of the CPU during it (default: 0)",
    )
    p.add_argument(
        "--out",
        type=Path,
        default=RESULTS_DIR,
        help="directory for the JSON, plots and server logs (default: bench/results)",
    )
    add_options(p)
    return p


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
    label = "mlxcel" if server.kind == "ours" else "mlx_lm.server"
    pid = server.proc.pid if server.proc is not None else None
    level_results = []
    tried: list[dict[str, Any]] = []
    for n in levels:
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
            time.sleep(1.0)
            other = summary["other_cpu_pct"]
            if other is None or other <= OTHER_CPU_WARN_PCT:
                break
            if attempt <= busy_retries:
                print(
                    f"[{label}]   other processes used {other:.0f}% of the CPU; "
                    "re-running this level",
                    flush=True,
                )
            else:
                print(
                    f"[{label}]   warning: other processes used {other:.0f}% of the CPU during "
                    "this level; the least disturbed attempt is kept, its numbers are skewed",
                    flush=True,
                )
        # The least disturbed attempt stands for the level.
        level_results.append(min(attempts, key=lambda r: r.cpu.get("other_cpu_pct") or 0.0))
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


def stopped(kind: Kind, server: Server) -> dict[str, Any] | None:
    """How the server stopped, with a note when SIGINT was not enough."""
    if server.stopped and server.stopped["signal"] != "SIGINT":
        print(f"note: {kind} server did not stop on SIGINT: {server.stopped}", flush=True)
    return server.stopped


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    levels: list[int] = args.levels
    try:
        long: LongConfig | None = config_from(args)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if not levels and long is None:
        print(
            "error: --levels is empty and --long-level not given: nothing to run", file=sys.stderr
        )
        return 2
    parallel: int = args.parallel or max(levels, default=1)
    prompt_concurrency: int = args.prompt_concurrency or min(parallel, 8)
    long_prompt_concurrency: int = args.prompt_concurrency or min(long.parallel if long else 0, 8)
    kinds: list[Kind] = [args.only] if args.only else ["ours", "peer"]

    model_dir: Path | None = args.model.expanduser().resolve() if args.model else None
    needs_folder = ("ours" in kinds and not args.our_url) or ("peer" in kinds and not args.peer_url)
    if model_dir is None:
        model_dir = default_model_dir()
        if needs_folder and model_dir is None:
            print(
                "error: no --model given and the default model location is unknown", file=sys.stderr
            )
            return 2
    if needs_folder:
        assert model_dir is not None
        if not (model_dir / "config.json").is_file():
            print(
                f"error: {model_dir} is not an MLX model folder (no config.json); run "
                "`mlxcel fetch-model` or pass --model",
                file=sys.stderr,
            )
            return 2

    stamp = datetime.now().strftime("%Y%m%d-%H%M%S")
    out_dir: Path = args.out
    out_dir.mkdir(parents=True, exist_ok=True)
    counter = TokenCounter(model_dir)

    def prompts(n: int, attempt: int) -> list[str]:
        tag = f"{n}" if attempt == 1 else f"{n}.{attempt}"
        return [make_prompt(f"{tag}-{i}", counter) for i in range(n)]

    def long_prompts(attempt: int) -> tuple[list[str], list[str]]:
        assert long is not None
        streams = [make_prompt(f"L{attempt}-{i}", counter) for i in range(long.streams)]
        uids = (f"{attempt}-{i}" for i in range(long.requests))
        return streams, [make_long_prompt(u, counter, long.prompt_tokens) for u in uids]

    report: dict[str, Any] = {
        "timestamp": stamp,
        "machine": machine(),
        "model": str(model_dir) if model_dir else None,
        "levels": levels,
        "max_tokens": args.max_tokens,
        "parallel": parallel,
        "peer_prompt_concurrency": prompt_concurrency,
        "prompt": {
            "target_tokens": PROMPT_TOKENS,
            "prefix_tokens": counter.count(PREFIX),
            "counted_with": "model tokenizer" if counter.exact else "word estimate",
            "example": prompts(1, 1)[0],
        },
        "long_level": None
        if long is None
        else asdict(long)
        | {
            "peer_prompt_concurrency": long_prompt_concurrency,
            "prompt_tokens_counted": counter.count(long_prompts(1)[1][0]),
        },
        "servers": {},
    }

    handle_stop_signals()
    failures: list[str] = []
    for kind in kinds:
        url = args.our_url if kind == "ours" else args.peer_url
        startup = args.startup_timeout
        label = "mlxcel" if kind == "ours" else "mlx_lm.server"
        entry: dict[str, Any] = {"label": label, "summary": []}
        report["servers"][kind] = entry
        try:
            if levels:
                wait_for_idle(args.wait_idle)
                log = out_dir / f"{stamp}-{kind}.log"
                factory = server_factory(
                    kind, url, model_dir, parallel, prompt_concurrency, log, startup
                )
                with running(factory) as server:
                    entry |= bench_server(
                        server,
                        levels,
                        args.max_tokens,
                        args.timeout,
                        prompts,
                        args.wait_idle,
                        args.busy_retries,
                    )
                entry["stopped"] = stopped(kind, server)
            if long is not None:
                # Its own server: one slot for every stream and every long request.
                wait_for_idle(args.wait_idle)
                log = out_dir / f"{stamp}-{kind}-long.log"
                factory = server_factory(
                    kind, url, model_dir, long.parallel, long_prompt_concurrency, log, startup
                )
                with running(factory) as server:
                    entry["long"] = bench_long(
                        server,
                        long,
                        args.timeout,
                        long_prompts,
                        args.wait_idle,
                        args.busy_retries,
                    )
                entry["long"]["stopped"] = stopped(kind, server)
        except (ServerStartError, httpx.HTTPError, OSError) as exc:
            failures.append(f"{kind}: {exc}")
            print(f"error: {kind} server: {exc}", file=sys.stderr, flush=True)

    servers = report["servers"]
    if "ours" in servers and "peer" in servers:
        report["ratios"] = ratios(servers["ours"]["summary"], servers["peer"]["summary"])
        if "long" in servers["ours"] and "long" in servers["peer"]:
            ours, peer = (servers[k]["long"]["summary"] for k in ("ours", "peer"))
            report["long_ratios"] = long_ratios(ours, peer)
    report["failures"] = failures
    json_path = out_dir / f"{stamp}.json"
    json_path.write_text(json.dumps(report, indent=2))

    print()
    print(
        f"model: {report['model']}, {args.max_tokens if levels else long and long.stream_tokens} "
        f"max output tokens, prompt ~{PROMPT_TOKENS} tokens "
        f"(shared prefix {report['prompt']['prefix_tokens']})"
    )
    for s in servers.values():
        if s["summary"]:
            blas = re.sub(r", from [^,\s]+", "", s.get("blas") or "BLAS not logged")
            print(f"\n{s['label']} ({blas})\n")
            print(server_table(s["summary"]))
    if report.get("ratios"):
        print("\nratios (ours / peer): tok/s above 1 and TTFT below 1 favour mlxcel\n")
        print(ratio_table(report["ratios"]))
    if long is not None:
        print_long(long, servers, report.get("long_ratios"))
    plots = plot(report, json_path.with_suffix("")) if levels and servers else []
    print(f"\nraw numbers: {json_path}")
    for path in plots:
        print(f"plot: {path}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
