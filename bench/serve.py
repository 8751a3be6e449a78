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

This file holds the command line and the run; the parts live next to it: sweep.py (the
levels against one server), servers.py (starting, checking and stopping the servers),
clients.py (the streaming requests), prompts.py, load.py (CPU readings), report.py
(statistics, tables, plots) and long_prompt.py (the long-prompt level).
"""

from __future__ import annotations

import argparse
import importlib
import json
import re
import sys
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

import httpx
from clients import Kind
from load import OTHER_CPU_WARN_PCT, wait_for_idle
from long_prompt import LongConfig, add_options, bench_long, config_from, long_ratios, print_long
from prompts import PREFIX, PROMPT_TOKENS, TokenCounter, make_long_prompt, make_prompt
from report import machine, plot, ratio_table, ratios, server_table
from servers import Server, ServerStartError, handle_stop_signals, running, server_factory
from sweep import bench_server

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
    add_target_options(p)
    add_run_options(p)
    add_options(p)
    return p


def add_target_options(p: argparse.ArgumentParser) -> None:
    """What is benched: the model, the servers, the concurrency levels and the slots."""
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


def add_run_options(p: argparse.ArgumentParser) -> None:
    """How a run goes: its time limits, waiting out busy CPUs, and where results go."""
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


def stopped(kind: Kind, server: Server) -> dict[str, Any] | None:
    """How the server stopped, with a note when SIGINT was not enough."""
    if server.stopped and server.stopped["signal"] != "SIGINT":
        print(f"note: {kind} server did not stop on SIGINT: {server.stopped}", flush=True)
    return server.stopped


class UsageError(Exception):
    """A command line that cannot run: its message is printed and the exit status is 2."""


@dataclass(frozen=True)
class Plan:
    """What a run benches, worked out from the command line."""

    levels: list[int]
    long: LongConfig | None
    parallel: int
    prompt_concurrency: int
    long_prompt_concurrency: int
    kinds: list[Kind]
    model_dir: Path | None


def plan_from(args: argparse.Namespace) -> Plan:
    """The run's plan; a UsageError when there is nothing to run or no model folder."""
    levels: list[int] = args.levels
    try:
        long: LongConfig | None = config_from(args)
    except ValueError as exc:
        raise UsageError(str(exc)) from exc
    if not levels and long is None:
        raise UsageError("--levels is empty and --long-level not given: nothing to run")
    parallel: int = args.parallel or max(levels, default=1)
    kinds: list[Kind] = [args.only] if args.only else ["ours", "peer"]
    return Plan(
        levels=levels,
        long=long,
        parallel=parallel,
        prompt_concurrency=args.prompt_concurrency or min(parallel, 8),
        long_prompt_concurrency=args.prompt_concurrency or min(long.parallel if long else 0, 8),
        kinds=kinds,
        model_dir=model_dir_from(args, kinds),
    )


def model_dir_from(args: argparse.Namespace, kinds: list[Kind]) -> Path | None:
    """The model folder: --model or the default one; it must be an MLX model folder when
    this run starts a server."""
    model_dir: Path | None = args.model.expanduser().resolve() if args.model else None
    needs_folder = ("ours" in kinds and not args.our_url) or ("peer" in kinds and not args.peer_url)
    if model_dir is None:
        model_dir = default_model_dir()
        if needs_folder and model_dir is None:
            raise UsageError("no --model given and the default model location is unknown")
    if needs_folder:
        assert model_dir is not None
        if not (model_dir / "config.json").is_file():
            raise UsageError(
                f"{model_dir} is not an MLX model folder (no config.json); run "
                "`mlxcel fetch-model` or pass --model"
            )
    return model_dir


@dataclass(frozen=True)
class Prompts:
    """Fresh prompts for every attempt (its tag in them), so no prompt cache helps."""

    counter: TokenCounter
    long: LongConfig | None

    def streams(self, n: int, attempt: int) -> list[str]:
        tag = f"{n}" if attempt == 1 else f"{n}.{attempt}"
        return [make_prompt(f"{tag}-{i}", self.counter) for i in range(n)]

    def long_level(self, attempt: int) -> tuple[list[str], list[str]]:
        long = self.long
        assert long is not None
        streams = [make_prompt(f"L{attempt}-{i}", self.counter) for i in range(long.streams)]
        uids = (f"{attempt}-{i}" for i in range(long.requests))
        return streams, [make_long_prompt(u, self.counter, long.prompt_tokens) for u in uids]


def new_report(
    args: argparse.Namespace, plan: Plan, stamp: str, prompts: Prompts
) -> dict[str, Any]:
    """The report's header: the machine, the model, the settings and the prompts used."""
    counter, long = prompts.counter, plan.long
    return {
        "timestamp": stamp,
        "machine": machine(),
        "model": str(plan.model_dir) if plan.model_dir else None,
        "levels": plan.levels,
        "max_tokens": args.max_tokens,
        "parallel": plan.parallel,
        "peer_prompt_concurrency": plan.prompt_concurrency,
        "prompt": {
            "target_tokens": PROMPT_TOKENS,
            "prefix_tokens": counter.count(PREFIX),
            "counted_with": "model tokenizer" if counter.exact else "word estimate",
            "example": prompts.streams(1, 1)[0],
        },
        "long_level": None
        if long is None
        else asdict(long)
        | {
            "peer_prompt_concurrency": plan.long_prompt_concurrency,
            "prompt_tokens_counted": counter.count(prompts.long_level(1)[1][0]),
        },
        "servers": {},
    }


def bench_kind(
    kind: Kind,
    args: argparse.Namespace,
    plan: Plan,
    prompts: Prompts,
    entry: dict[str, Any],
    stamp: str,
) -> None:
    """Bench one kind of server: the sweep on one server, then the long-prompt level on
    another; the results go into `entry`."""
    url = args.our_url if kind == "ours" else args.peer_url
    startup = args.startup_timeout
    out_dir: Path = args.out
    if plan.levels:
        wait_for_idle(args.wait_idle)
        log = out_dir / f"{stamp}-{kind}.log"
        factory = server_factory(
            kind, url, plan.model_dir, plan.parallel, plan.prompt_concurrency, log, startup
        )
        with running(factory) as server:
            entry |= bench_server(
                server,
                plan.levels,
                args.max_tokens,
                args.timeout,
                prompts.streams,
                args.wait_idle,
                args.busy_retries,
            )
        entry["stopped"] = stopped(kind, server)
    if (long := plan.long) is not None:
        # Its own server: one slot for every stream and every long request.
        wait_for_idle(args.wait_idle)
        log = out_dir / f"{stamp}-{kind}-long.log"
        factory = server_factory(
            kind, url, plan.model_dir, long.parallel, plan.long_prompt_concurrency, log, startup
        )
        with running(factory) as server:
            entry["long"] = bench_long(
                server,
                long,
                args.timeout,
                prompts.long_level,
                args.wait_idle,
                args.busy_retries,
            )
        entry["long"]["stopped"] = stopped(kind, server)


def add_ratios(report: dict[str, Any]) -> None:
    """Ours against the peer, for the sweep and the long-prompt level, when both ran."""
    servers = report["servers"]
    if "ours" in servers and "peer" in servers:
        report["ratios"] = ratios(servers["ours"]["summary"], servers["peer"]["summary"])
        if "long" in servers["ours"] and "long" in servers["peer"]:
            ours, peer = (servers[k]["long"]["summary"] for k in ("ours", "peer"))
            report["long_ratios"] = long_ratios(ours, peer)


def print_report(
    args: argparse.Namespace, plan: Plan, report: dict[str, Any], json_path: Path
) -> None:
    """The tables of every server and the ratios, then where the numbers and plots are."""
    levels, long, servers = plan.levels, plan.long, report["servers"]
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


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        plan = plan_from(args)
    except UsageError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    stamp = datetime.now().strftime("%Y%m%d-%H%M%S")
    out_dir: Path = args.out
    out_dir.mkdir(parents=True, exist_ok=True)
    prompts = Prompts(TokenCounter(plan.model_dir), plan.long)
    report = new_report(args, plan, stamp, prompts)

    handle_stop_signals()
    failures: list[str] = []
    for kind in plan.kinds:
        label = "mlxcel" if kind == "ours" else "mlx_lm.server"
        entry: dict[str, Any] = {"label": label, "summary": []}
        report["servers"][kind] = entry
        try:
            bench_kind(kind, args, plan, prompts, entry, stamp)
        except (ServerStartError, httpx.HTTPError, OSError) as exc:
            failures.append(f"{kind}: {exc}")
            print(f"error: {kind} server: {exc}", file=sys.stderr, flush=True)

    add_ratios(report)
    report["failures"] = failures
    json_path = out_dir / f"{stamp}.json"
    json_path.write_text(json.dumps(report, indent=2))
    print_report(args, plan, report, json_path)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
