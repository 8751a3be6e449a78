"""How fast a server reads prompts of growing length, alone, on a fresh (cold) server.

For each prompt length (default 256, 4096 and 8000 tokens, then a Codex-sized ~8,600)
it sends single requests one at a time, each a different prompt (so no prompt cache
shortens it), with a 16-token budget, through Chat Completions at temperature 0; a
request's read rate is its prompt tokens over its time to first token. It prints each
length's median rate, its ratio to the shortest prompt's (long prompts pay attention
over a growing context; the ratio says how much), and the first request's time to first
token, the cold one a new agent session waits for.

    .venv/bin/python bench/read_rate.py [--only ours,peer,llamacpp] [--lengths 256,4096,8000,8600]

Prints figures; asserts nothing.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from gguf import ensure_default_gguf
from llamacpp import binary, context_size
from load import CpuSample, cpu_shares
from probe import one_request
from prompts import TokenCounter, make_long_prompt
from report import LABELS, fmt, markdown_table
from servers import Launch, Server, handle_stop_signals, running, server_factory

from mlxcel.model.provision import fetch

OUTPUT_TOKENS = 16


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--only", default="ours", help="servers: ours, peer, llamacpp (default: ours)")
    p.add_argument("--lengths", default="256,4096,8000,8600", help="prompt tokens, shortest first")
    p.add_argument("--repeats", type=int, default=2, help="requests per length (default: 2)")
    p.add_argument("--timeout", type=float, default=1800.0, help="seconds allowed a request")
    p.add_argument("--out", type=Path, default=Path("bench/results"), help="server logs")
    return p.parse_args(argv)


def read_once(server: Server, prompt: str, tokens: int, timeout: float) -> dict[str, Any]:
    pid = server.proc.pid if server.proc is not None else None
    before, started = CpuSample.take(pid), time.perf_counter()
    result = one_request(server, prompt, OUTPUT_TOKENS, timeout)
    shares = cpu_shares(before, CpuSample.take(pid), time.perf_counter() - started)
    ttft = result.ttft if result.ok else None
    return {
        "tokens": tokens,
        "ttft_s": ttft,
        "tok_s": tokens / ttft if ttft else None,
        "error": result.error,
        "other_cpu_pct": shares.get("other_cpu_pct"),
    }


def bench_kind(kind: str, args: argparse.Namespace, lengths: list[int]) -> dict[str, Any]:
    model_dir = fetch.default_model_dir()
    counter = TokenCounter(model_dir)
    prompts = {
        n: [make_long_prompt(f"read-{n}-{i}", counter, n) for i in range(args.repeats)]
        for n in lengths
    }
    peer_dir = fetch.model_dir(fetch.DEFAULT_MODEL.at("float32")) if kind == "peer" else None
    gguf = ensure_default_gguf() if kind == "llamacpp" else None
    program = binary()[0] if kind == "llamacpp" else None
    n_ctx = context_size(max(lengths), 1, OUTPUT_TOKENS)
    launch = Launch(
        model_dir, 1, 1, gguf=gguf, n_ctx=n_ctx, llama_server=program, peer_model_dir=peer_dir
    )
    args.out.mkdir(parents=True, exist_ok=True)
    log = args.out / f"read-rate-{kind}.log"
    runs: dict[int, list[dict[str, Any]]] = {}
    with running(server_factory(kind, None, launch, log, 900.0)) as server:  # type: ignore[arg-type]
        for n in lengths:
            runs[n] = []
            for prompt in prompts[n]:
                exact = counter.count(prompt)
                run = read_once(server, prompt, exact, args.timeout)
                print(
                    f"[{LABELS[kind]}] {exact} tokens: {fmt(run['tok_s'], '{:.0f}')} tok/s, "
                    f"TTFT {fmt(run['ttft_s'], '{:.1f}')} s",
                    flush=True,
                )
                runs[n].append(run)
    return {"runs": runs, "cold_ttft_s": runs[lengths[-1]][0]["ttft_s"]}


def table(results: dict[str, dict[str, Any]], lengths: list[int]) -> str:
    rows = []
    for kind, result in results.items():
        rates = {
            n: statistics.median([r["tok_s"] for r in runs if r["tok_s"]] or [0.0])
            for n, runs in result["runs"].items()
        }
        short = rates[lengths[0]] or None
        for n in lengths:
            ratio = rates[n] / short if short else None
            first = result["runs"][n][0]["ttft_s"]
            rows.append(
                [
                    LABELS[kind],
                    str(n),
                    fmt(rates[n], "{:.0f}"),
                    fmt(ratio, "{:.2f}"),
                    fmt(first, "{:.1f}"),
                ]
            )
    header = ["server", "prompt tokens", "read tok/s (median)", "rate / shortest's", "first TTFT s"]
    return markdown_table(header, rows)


def main(argv: list[str]) -> int:
    handle_stop_signals()
    args = parse_args(argv)
    lengths = [int(x) for x in args.lengths.split(",") if x]
    results = {kind: bench_kind(kind, args, lengths) for kind in args.only.split(",") if kind}
    print()
    print(table(results, lengths))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
