"""Where a decode step's time goes in the MLX engine: the model, or our Python around it.

For each batch size N it inserts N of the serving benchmark's prompts into `MlxEngine`
(as the model actor does), runs every step under `cProfile` until all sequences end,
and splits the time of the engine's two phases (`MlxEngine.decode` and `prefill`) into
the MLX work (the forwards and the sampling, which evaluate the arrays) and the rest:
our per-token work (the step plan, detokenisation, `TokenStep`s, the prompt cache's
bookkeeping). Prints figures; asserts nothing.

    .venv/bin/python bench/profile_engine.py [--levels 1,8,32,64] [--max-tokens 32]
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import time
from pathlib import Path
from typing import Any

from prompts import TokenCounter, make_prompt

from mlxcel.config import Settings
from mlxcel.model.native.blas import BlasInfo, describe, load_fast_blas
from mlxcel.model.provision.fetch import default_model_dir, is_ready


def cumulative(stats: pstats.Stats, name: str, file_part: str) -> float:
    """Cumulative seconds of the outermost function called `name` in a file matching
    (nested functions of the same name are inside it)."""
    table: dict[Any, Any] = stats.stats  # type: ignore[attr-defined]
    rows = [row[3] for (path, _, func), row in table.items() if func == name and file_part in path]
    return max(rows, default=0.0)


def profile_level(
    path: Path, blas: BlasInfo, n: int, max_tokens: int, counter: TokenCounter
) -> None:
    """Run N prompts to their end under cProfile and print the level's row."""
    from mlxcel.generation import Sampling, SequenceSpec
    from mlxcel.model.mlx_load import load_mlx_model

    loaded = load_mlx_model(
        path,
        name=path.name,
        max_batch=n,
        prefill_step_size=256,
        blas=blas,
        prompt_cache_bytes=Settings().prompt_cache_bytes,
    )
    engine = loaded.engine
    sampling = Sampling(temperature=0.0, max_tokens=max_tokens)
    for i in range(n):
        text = make_prompt(f"p{n}-{i}", counter)
        prompt = loaded.codec.render([{"role": "user", "content": text}], None)
        engine.insert(SequenceSpec(i, tuple(prompt), sampling))
    profile = cProfile.Profile()
    steps, started = 0, time.perf_counter()
    profile.enable()
    while engine.has_work():
        engine.step()
        steps += 1
    profile.disable()
    wall = time.perf_counter() - started
    stats = pstats.Stats(profile)
    step = cumulative(stats, "decode", "mlx_engine") + cumulative(stats, "prefill", "mlx_engine")
    model = sum(
        cumulative(stats, name, part)
        for name, part in (
            ("decode_logits", "forward.py"),
            ("read_chunk", "forward.py"),
            ("sample", "sampling.py"),
        )
    )
    ours = step - model
    print(
        f"| {n:>2} | {steps:5d} | {wall:6.1f} | {model:25.1f} s "
        f"| {1000 * ours / steps:16.2f} ms | {100 * ours / step:4.1f}% |"
    )
    engine.close()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", type=Path, default=None)
    parser.add_argument("--levels", default="1,8,32,64")
    parser.add_argument("--max-tokens", type=int, default=32)
    args = parser.parse_args()
    path = args.model or default_model_dir()
    if args.model is None and not is_ready(path):
        raise SystemExit("run `mlxcel fetch-model` first, or pass --model")

    blas = load_fast_blas()  # before anything imports mlx.core
    print(describe(blas))
    levels = [int(n) for n in args.levels.split(",")]
    counter = TokenCounter(path)
    print("|  N | steps | wall s | in MLX (forwards, sampling) | our Python per step | share |")
    print("|---:|------:|-------:|----------------------------:|--------------------:|------:|")
    for n in levels:
        profile_level(path, blas, n, args.max_tokens, counter)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
