"""The engine against the path it replaced: our MLX engine and mlx-lm's `BatchGenerator`.

For each batch size N it runs the same N serving-benchmark prompts, greedy, `--max-tokens`
each, through both: the old path (mlx-lm's continuous batching, configured as `--parallel
N` once configured it: completion batch N, prefill batch min(N, 8), prefill step 256) and
the new one (`MlxEngine`, max batch N, the server's default step cap `--step-cap`, no
prefix cache). It prints
the mean decode step while all N rows decode (old: a `next()` that only decodes; new: a
`decode()` that yields N tokens; where ours never held all N at once, at the largest
batch both decoded, marked *), their ratio, end-to-end output tok/s (insert to last
token), prompt tok/s (old: mlx-lm's own prompt counters; new: prompt tokens over the time
spent in `prefill()`), and how many sequences came out token for token identical (with
the first diverging position of each that did not). A last row reads one long prompt
(`--long-tokens`) from scratch on both, and on the new engine, in the same run, 16 short
prompts: the long/short ratio of prefill rates shows what a long context costs per
token. Prints figures; asserts nothing.

    .venv/bin/python bench/engine.py [--levels 1,16,64] [--max-tokens 64] [--long-tokens 8000]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from prompts import TokenCounter, make_long_prompt, make_prompt

from mlxcel.generation import Sampling, SequenceSpec
from mlxcel.model.engine import LoadedModel
from mlxcel.model.native.blas import BlasInfo, describe, load_fast_blas
from mlxcel.model.provision.fetch import default_model_dir, is_ready


@dataclass
class Run:
    """One path's pass over a set of prompts."""

    tokens: list[list[int]]
    wall: float
    prompt_tokens: int
    prompt_time: float
    decode_steps: dict[int, list[float]] = field(default_factory=dict)
    """Seconds of each step that only decoded, by the rows it decoded."""

    def step_ms(self, rows: int) -> float:
        steps = self.decode_steps.get(rows)
        return 1000 * statistics.mean(steps) if steps else float("nan")

    @property
    def output_tps(self) -> float:
        return sum(len(t) for t in self.tokens) / self.wall

    @property
    def prompt_tps(self) -> float:
        return self.prompt_tokens / self.prompt_time if self.prompt_time else float("nan")


def run_old(model: Any, stop: list[int], rows: list[list[int]], max_tokens: int, cap: int) -> Run:
    """mlx-lm's `BatchGenerator`, driven one `next()` at a time, on mlx-lm's own ops (the
    CPU forms the new engine installs are set aside while it runs)."""
    from mlxcel.model.native.cpu_forms import reference_forms

    with reference_forms():
        return _run_old(model, stop, rows, max_tokens, cap)


def _run_old(model: Any, stop: list[int], rows: list[list[int]], max_tokens: int, cap: int) -> Run:
    import mlx.core as mx
    from mlx_lm.generate import BatchGenerator

    n = len(rows)
    gen: Any = BatchGenerator(
        model,
        stop_tokens=[[t] for t in stop],
        completion_batch_size=n,
        prefill_batch_size=min(n, 8),
        prefill_step_size=cap,
    )
    started = time.perf_counter()
    uids = gen.insert(rows, [max_tokens] * n)
    out: dict[int, list[int]] = {uid: [] for uid in uids}
    steps: dict[int, list[float]] = {}
    with gen.stats() as stats, mx.stream(gen.stream):
        while True:
            tic = time.perf_counter()
            prompt_responses, responses = gen.next()
            if not prompt_responses and not responses:
                break
            if responses and not prompt_responses:
                steps.setdefault(len(responses), []).append(time.perf_counter() - tic)
            for r in responses:
                out[r.uid].append(r.token)
    wall = time.perf_counter() - started
    gen.close()
    tokens = [out[uid] for uid in uids]
    return Run(tokens, wall, stats.prompt_tokens, stats.prompt_time, steps)


def run_new(loaded: LoadedModel, rows: list[list[int]], max_tokens: int) -> Run:
    """Our engine, its two phases timed apart."""
    engine = loaded.engine
    started = time.perf_counter()
    for i, row in enumerate(rows):
        engine.insert(SequenceSpec(i, tuple(row), Sampling(temperature=0.0, max_tokens=max_tokens)))
    out: list[list[int]] = [[] for _ in rows]
    decode_steps: dict[int, list[float]] = {}
    prompt_time = 0.0
    while engine.has_work():
        tic = time.perf_counter()
        steps = engine.decode()
        if steps:
            decode_steps.setdefault(len(steps), []).append(time.perf_counter() - tic)
        tic = time.perf_counter()
        firsts = engine.prefill()
        prompt_time += time.perf_counter() - tic
        for step in [*steps, *firsts]:
            out[step.seq_id].append(step.token)
    wall = time.perf_counter() - started
    return Run(out, wall, sum(len(r) for r in rows), prompt_time, decode_steps)


def divergence(old: list[list[int]], new: list[list[int]]) -> tuple[int, list[str]]:
    """Sequences identical token for token, and where each other one first differs."""
    same, notes = 0, []
    for i, (a, b) in enumerate(zip(old, new, strict=True)):
        if a == b:
            same += 1
            continue
        k = next(
            (k for k, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b))
        )
        notes.append(f"seq {i} at {k} (old {a[k : k + 3]}, new {b[k : k + 3]})")
    return same, notes


def load_new(path: Path, blas: BlasInfo, n: int, cap: int) -> LoadedModel:
    from mlxcel.model.mlx_load import load_mlx_model

    return load_mlx_model(
        path,
        name=path.name,
        max_batch=n,
        prefill_step_size=cap,
        blas=blas,
        prompt_cache_bytes=0,
        max_step_ms=0.0,
    )


def render(loaded: LoadedModel, text: str) -> list[int]:
    return loaded.codec.render([{"role": "user", "content": text}], None)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", type=Path, default=None)
    parser.add_argument("--levels", default="1,16,64")
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--prefill-step-size", type=int, default=256, help="the old path's")
    parser.add_argument(
        "--step-cap", type=int, default=512, help="prompt tokens a step of ours reads at most"
    )
    parser.add_argument("--long-tokens", type=int, default=8000, help="0: no long-prompt row")
    return parser


def warm_up(loaded: LoadedModel, counter: TokenCounter, cap: int) -> None:
    """The first forwards build kernels: run both paths once, untimed."""
    engine: Any = loaded.engine
    model, stop = engine.model, list(engine.tokenizer.eos_token_ids)
    warm = [render(loaded, make_prompt(f"w-{i}", counter)) for i in range(2)]
    run_old(model, stop, warm, 4, cap)
    run_new(loaded, warm, 4)


def bench_batch(
    loaded: LoadedModel, counter: TokenCounter, n: int, max_tokens: int, cap: int
) -> dict[str, Any]:
    """N prompts through both paths on one loaded model (closed after): one table row."""
    engine: Any = loaded.engine
    model, stop = engine.model, list(engine.tokenizer.eos_token_ids)
    prompts = [render(loaded, make_prompt(f"e{n}-{i}", counter)) for i in range(n)]
    old = run_old(model, stop, prompts, max_tokens, cap)
    new = run_new(loaded, prompts, max_tokens)
    loaded.engine.close()
    same, notes = divergence(old.tokens, new.tokens)
    # At full batch if both paths got there (ours may not: while it reads the last
    # prompts the first sequences can finish), else the largest batch both decoded.
    common = set(old.decode_steps) & set(new.decode_steps)
    rows_compared = n if n in common else max(common, default=0)
    return {
        "n": n,
        "rows": rows_compared,
        "old_step_ms": old.step_ms(rows_compared),
        "new_step_ms": new.step_ms(rows_compared),
        "steps": [
            len(old.decode_steps.get(rows_compared, [])),
            len(new.decode_steps.get(rows_compared, [])),
        ],
        "new_peak_rows": max(new.decode_steps, default=0),
        "old_tps": old.output_tps,
        "new_tps": new.output_tps,
        "old_prompt_tps": old.prompt_tps,
        "new_prompt_tps": new.prompt_tps,
        "identical": same,
        "diverging": notes,
        "load": os.getloadavg()[0],
    }


def print_table(rows: list[dict[str, Any]]) -> None:
    """The batch rows as a markdown table, then each divergence and the peak-batch note."""
    header = "|  N | rows | old step ms | new step ms | old/new | old tok/s | new tok/s "
    header += "| old prompt tok/s | new prompt tok/s | identical | load |"
    print(header)
    print("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        print(
            f"| {r['n']:>2} | {r['rows']}{'' if r['rows'] == r['n'] else '*'} | {r['old_step_ms']:.1f} | {r['new_step_ms']:.1f} "
            f"| {r['old_step_ms'] / r['new_step_ms']:.2f} | {r['old_tps']:.1f} | {r['new_tps']:.1f} "
            f"| {r['old_prompt_tps']:.1f} | {r['new_prompt_tps']:.1f} "
            f"| {r['identical']}/{r['n']} | {r['load']:.2f} |"
        )
    for r in rows:
        for note in r["diverging"]:
            print(f"N={r['n']}: {note}")
    if any(r["rows"] != r["n"] for r in rows):
        print("* the engine never decoded all N rows at once (peak: ", end="")
        print(", ".join(f"N={r['n']}: {r['new_peak_rows']}" for r in rows) + ")")


def bench_long_prompt(
    path: Path, blas: BlasInfo, counter: TokenCounter, long_tokens: int, step_cap: int, cap: int
) -> dict[str, Any]:
    """One long prompt from scratch on both paths, and 16 short ones on ours: what a long
    context costs per prompt token."""
    loaded = load_new(path, blas, 16, step_cap)
    engine: Any = loaded.engine
    model, stop = engine.model, list(engine.tokenizer.eos_token_ids)
    long = [render(loaded, make_long_prompt("long-0", counter, long_tokens))]
    short = [render(loaded, make_prompt(f"short-{i}", counter)) for i in range(16)]
    old_long = run_old(model, stop, long, 1, cap)
    new_long = run_new(loaded, long, 1)
    new_short = run_new(loaded, short, 1)
    loaded.engine.close()
    ratio = new_long.prompt_tps / new_short.prompt_tps
    print(
        f"long prompt ({len(long[0])} tokens, no prefix cache): prompt tok/s old "
        f"{old_long.prompt_tps:.1f}, new {new_long.prompt_tps:.1f}; new on 16 short prompts "
        f"({sum(len(s) for s in short)} tokens) {new_short.prompt_tps:.1f}; "
        f"long/short {ratio:.2f}; load average {os.getloadavg()[0]:.2f}"
    )
    return {
        "long_tokens": len(long[0]),
        "old_prompt_tps": old_long.prompt_tps,
        "new_prompt_tps": new_long.prompt_tps,
        "new_short_prompt_tps": new_short.prompt_tps,
        "long_over_short": ratio,
    }


def main() -> int:
    args = build_parser().parse_args()
    path = args.model or default_model_dir()
    if args.model is None and not is_ready(path):
        raise SystemExit("run `mlxcel fetch-model` first, or pass --model")

    blas = load_fast_blas()  # before anything imports mlx.core
    print(describe(blas))
    print(f"load average at start: {os.getloadavg()[0]:.2f} ({os.cpu_count()} cores)")
    counter = TokenCounter(path)
    cap = args.prefill_step_size
    rows: list[dict[str, Any]] = []
    warmed = False
    for n in [int(level) for level in args.levels.split(",") if level]:
        loaded = load_new(path, blas, n, args.step_cap)
        if not warmed:  # first forwards build kernels; time neither path's
            warm_up(loaded, counter, cap)
            warmed = True
        rows.append(bench_batch(loaded, counter, n, args.max_tokens, cap))
        print(f"N={n} done, load average {rows[-1]['load']:.2f}", flush=True)

    print_table(rows)
    if args.long_tokens > 0:
        rows.append(bench_long_prompt(path, blas, counter, args.long_tokens, args.step_cap, cap))
    print(json.dumps(rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
