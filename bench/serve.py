"""Streaming benchmark: mlxcel-server against mlx_lm.server on the same model folder,
and against llama.cpp (its own llama-server, with as many slots) on the same model's own
GGUF.

For every concurrency level N it fires N streaming requests at once (one thread per
client, official `openai` SDK), measures time to first token, inter-token latency, time
per output token and throughput, prints one table per server plus a ratio table, and
writes the raw numbers to `bench/results/<timestamp>.json` (and PNG plots when
matplotlib is importable). Before the levels, each server also answers single requests
alone (probe.py): its decode rate and its prompt-reading rate. See
bench/README.md for the metric definitions.

Run from the repository root:

    .venv/bin/python bench/serve.py                  # every server, levels 1,4,16,64
    .venv/bin/python bench/serve.py --levels 1,4 --only ours,llamacpp
    .venv/bin/python bench/serve.py --levels '' --probe-repeats 0 --long-level

The servers are started one after the other, never together, and always stopped.

This file holds the run; the parts live next to it: options.py (the command line),
sweep.py (the levels against one server), probe.py (single requests), servers.py
(starting, checking and stopping the servers), llamacpp.py, llama_server.py and gguf.py
(the llama.cpp peer, its build and its GGUF), clients.py (the streaming requests),
prompts.py, load.py (CPU readings), report.py (statistics, tables, plots) and
long_prompt.py (the long-prompt level).
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

import httpx
import llamacpp
from clients import Kind, use_sampling
from gguf import GgufUnavailable, ensure_default_gguf
from llama_server import BuildError
from load import wait_for_idle
from long_prompt import LongConfig, bench_long, config_from, long_ratios, print_long
from options import UsageError, build_parser, kinds_from, model_dir_from, peer_model_dir_from
from probe import HAIKU, probe_server, probe_table
from prompts import PREFIX, PROMPT_TOKENS, TokenCounter, make_long_prompt, make_prompt
from report import LABELS, hardware_line, machine, plot, ratio_table, ratios, server_table
from servers import (
    Launch,
    Server,
    ServerStartError,
    handle_stop_signals,
    running,
    server_factory,
)
from sweep import bench_server


def stopped(kind: Kind, server: Server) -> dict[str, Any] | None:
    """How the server stopped, with a note when SIGINT was not enough."""
    if server.stopped and server.stopped["signal"] != "SIGINT":
        print(f"note: {kind} server did not stop on SIGINT: {server.stopped}", flush=True)
    return server.stopped


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
    urls: dict[Kind, str | None]
    probe_repeats: int
    read_tokens: int
    gguf: Path | None
    """--gguf; without it the default model's GGUF is obtained when llama.cpp starts."""
    peer_model_dir: Path | None = None
    """--peer-model, else the default model's float32 folder when neither --model is given."""


def plan_from(args: argparse.Namespace) -> Plan:
    """The run's plan; a UsageError when there is nothing to run or no model folder."""
    levels: list[int] = args.levels
    try:
        long: LongConfig | None = config_from(args)
    except ValueError as exc:
        raise UsageError(str(exc)) from exc
    if not levels and long is None and args.probe_repeats < 1:
        raise UsageError("--levels empty, --probe-repeats 0, no --long-level: nothing to run")
    if args.long_prompt_tokens < 200:
        raise UsageError("--long-prompt-tokens needs at least 200")
    parallel: int = args.parallel or max(levels, default=1)
    urls: dict[Kind, str | None] = {
        "ours": args.our_url,
        "peer": args.peer_url,
        "llamacpp": args.llamacpp_url,
    }
    kinds = kinds_from(args)
    return Plan(
        levels=levels,
        long=long,
        parallel=parallel,
        prompt_concurrency=args.prompt_concurrency or min(parallel, 8),
        long_prompt_concurrency=args.prompt_concurrency or min(long.parallel if long else 0, 8),
        kinds=kinds,
        model_dir=model_dir_from(args, kinds),
        urls=urls,
        probe_repeats=max(0, args.probe_repeats),
        read_tokens=args.long_prompt_tokens,
        gguf=args.gguf.expanduser().resolve() if args.gguf else None,
        peer_model_dir=peer_model_dir_from(args),
    )


@dataclass(frozen=True)
class Prompts:
    """Fresh prompts for every attempt (its tag in them), so no prompt cache helps."""

    counter: TokenCounter
    long: LongConfig | None
    read_tokens: int
    """--long-prompt-tokens: the long prompts' length, at the long level and alone."""

    def streams(self, n: int, attempt: int) -> list[str]:
        tag = f"{n}" if attempt == 1 else f"{n}.{attempt}"
        return [make_prompt(f"{tag}-{i}", self.counter) for i in range(n)]

    def long_level(self, attempt: int) -> tuple[list[str], list[str]]:
        long = self.long
        assert long is not None
        streams = [make_prompt(f"L{attempt}-{i}", self.counter) for i in range(long.streams)]
        uids = (f"{attempt}-{i}" for i in range(long.requests))
        return streams, [make_long_prompt(u, self.counter, long.prompt_tokens) for u in uids]

    def reads(self, k: int) -> list[str]:
        """The single requests' long prompts: the long level's kind, none of its own."""
        return [make_long_prompt(f"read-{i}", self.counter, self.read_tokens) for i in range(k)]


def new_report(
    args: argparse.Namespace, plan: Plan, stamp: str, prompts: Prompts
) -> dict[str, Any]:
    """The report's header: the machine, the model, the settings and the prompts used."""
    counter, long = prompts.counter, plan.long
    return {
        "timestamp": stamp,
        "machine": machine(),
        "model": str(plan.model_dir) if plan.model_dir else None,
        "peer_model": str(plan.peer_model_dir) if plan.peer_model_dir else None,
        "levels": plan.levels,
        "max_tokens": args.max_tokens,
        "sampling": {"temperature": args.temperature, "top_p": args.top_p},
        "parallel": plan.parallel,
        "peer_prompt_concurrency": plan.prompt_concurrency,
        "single_requests": {"haiku": HAIKU, "repeats": plan.probe_repeats},
        "llamacpp": {
            "threads": llamacpp.threads(),
            "parallel": plan.parallel,
            "n_ctx": llamacpp.context_size(plan.read_tokens, plan.parallel, args.max_tokens),
            "build": llamacpp.build_record() if plan.urls["llamacpp"] is None else "external",
        },
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


def launch_for(
    kind: Kind, plan: Plan, parallel: int, prompt_concurrency: int, n_ctx: int
) -> Launch:
    """What a started server of this kind loads; llama.cpp's GGUF and binary are found here."""
    gguf, program = plan.gguf, None
    if kind == "llamacpp" and plan.urls[kind] is None:
        gguf = gguf or ensure_default_gguf()
        program = llamacpp.binary()[0]
    return Launch(
        plan.model_dir,
        parallel,
        prompt_concurrency,
        gguf=gguf,
        n_ctx=n_ctx,
        llama_server=program,
        peer_model_dir=plan.peer_model_dir,
    )


def bench_kind(
    kind: Kind,
    args: argparse.Namespace,
    plan: Plan,
    prompts: Prompts,
    entry: dict[str, Any],
    stamp: str,
) -> None:
    """Bench one kind of server: the single requests and the sweep on one server, then the
    long-prompt level on another; the results go into `entry`."""
    url, startup, out_dir = plan.urls[kind], args.startup_timeout, args.out
    if plan.levels or plan.probe_repeats:
        wait_for_idle(args.wait_idle)
        log = out_dir / f"{stamp}-{kind}.log"
        n_ctx = llamacpp.context_size(plan.read_tokens, plan.parallel, args.max_tokens)
        launch = launch_for(kind, plan, plan.parallel, plan.prompt_concurrency, n_ctx)
        if kind == "llamacpp" and url is None:
            entry["detail"] = (
                f"{launch.gguf.name if launch.gguf else 'GGUF'}, llama-server --parallel "
                f"{launch.parallel} --kv-unified --ctx-size {n_ctx}, {llamacpp.threads()} threads"
            )
        with running(server_factory(kind, url, launch, log, startup)) as server:
            if plan.probe_repeats:
                reads = prompts.reads(plan.probe_repeats)
                read_tokens = prompts.counter.count(reads[0])
                entry["probe"] = probe_server(
                    server, args.max_tokens, plan.probe_repeats, reads, read_tokens, args.timeout
                )
            if plan.levels:
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
    if (long := plan.long) is None:
        return
    # Its own server: one slot for every stream and every long request.
    wait_for_idle(args.wait_idle)
    log = out_dir / f"{stamp}-{kind}-long.log"
    n_ctx = llamacpp.context_size(
        long.prompt_tokens, long.streams, long.stream_tokens, long.requests
    )
    launch = launch_for(kind, plan, long.parallel, plan.long_prompt_concurrency, n_ctx)
    with running(server_factory(kind, url, launch, log, startup)) as server:
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
    """Ours against each peer that ran: mlx_lm.server for the sweep and the long-prompt
    level, llama.cpp for the sweep."""
    servers = report["servers"]
    if "ours" in servers and "llamacpp" in servers:
        ours, other = (servers[k]["summary"] for k in ("ours", "llamacpp"))
        report["ratios_llamacpp"] = ratios(ours, other)
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
        f"(shared prefix {report['prompt']['prefix_tokens']}), "
        f"temperature {args.temperature}, top_p {args.top_p}"
    )
    print(hardware_line(report))
    if (probes := probe_table(servers)) is not None:
        print(f"\nsingle requests alone, through Chat Completions (medians)\n\n{probes}")
    for s in servers.values():
        if s["summary"]:
            blas = re.sub(r", from [^,\s]+", "", s.get("blas") or "BLAS not logged")
            print(f"\n{s['label']} ({s.get('detail') or blas})\n")
            print(server_table(s["summary"]))
    for key, peer in (("ratios", "peer"), ("ratios_llamacpp", "llama.cpp")):
        if report.get(key):
            print(f"\nratios (ours / {peer}): tok/s above 1 and TTFT below 1 favour mlxcel\n")
            print(ratio_table(report[key], "llamacpp" if key == "ratios_llamacpp" else "peer"))
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
    use_sampling(args.temperature, args.top_p)
    stamp = datetime.now().strftime("%Y%m%d-%H%M%S")
    out_dir: Path = args.out
    out_dir.mkdir(parents=True, exist_ok=True)
    prompts = Prompts(TokenCounter(plan.model_dir), plan.long, plan.read_tokens)
    report = new_report(args, plan, stamp, prompts)

    handle_stop_signals()
    failures: list[str] = []
    for kind in plan.kinds:
        entry: dict[str, Any] = {"label": LABELS[kind], "summary": []}
        report["servers"][kind] = entry
        try:
            bench_kind(kind, args, plan, prompts, entry, stamp)
        except (ServerStartError, GgufUnavailable, BuildError, httpx.HTTPError, OSError) as exc:
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
