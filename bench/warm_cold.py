"""Time to first token of a follow-up turn, with and without the prompt (prefix) cache.

Engine-level, one process, no HTTP: a first turn with a long user message (about
`--history` tokens) is answered, then the follow-up turn (the whole history plus a new
question) is timed from `insert` to its first token, cold (no prefix cache) and warm
(the cache holds what the first turn computed). Prints figures; asserts nothing.

    .venv/bin/python bench/warm_cold.py [--model DIR] [--history 2000] [--trials 3]
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path
from typing import Any

from mlxcel.config import Settings
from mlxcel.generation import Sampling, SequenceSpec
from mlxcel.model.blas import describe, load_fast_blas
from mlxcel.model.engine import LoadedModel
from mlxcel.model.provision.fetch import default_model_dir, is_ready


def document(tokens: int) -> str:
    """Synthetic source-like text of roughly `tokens` tokens (about 28 a line)."""
    lines = [
        f"def f_{i}(x):\n    return x * {i} + {i * i}  # step {i}" for i in range(tokens // 28)
    ]
    return "\n".join(lines)


def first_token(loaded: LoadedModel, seq_id: int, prompt: list[int]) -> tuple[float, int]:
    """Seconds from insert to the sequence's first token, and its cached prompt tokens;
    the sequence is then dropped."""
    engine = loaded.engine
    start = time.perf_counter()
    engine.insert(SequenceSpec(seq_id, tuple(prompt), Sampling(temperature=0.0, max_tokens=64)))
    while True:
        for step in engine.step():
            if step.seq_id == seq_id:
                elapsed = time.perf_counter() - start
                engine.remove(seq_id)
                return elapsed, step.cached_tokens


def answer(loaded: LoadedModel, seq_id: int, prompt: list[int], max_tokens: int) -> str:
    engine = loaded.engine
    engine.insert(SequenceSpec(seq_id, tuple(prompt), Sampling(0.0, max_tokens=max_tokens)))
    text = []
    while engine.has_work():
        text += [s.text for s in engine.step() if s.seq_id == seq_id]
    return "".join(text)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", type=Path, default=None, help="MLX model folder")
    parser.add_argument("--history", type=int, default=2000, help="first-turn tokens")
    parser.add_argument("--reply", type=int, default=32, help="first-turn reply tokens")
    parser.add_argument("--trials", type=int, default=3)
    args = parser.parse_args()
    path = args.model or default_model_dir()
    if args.model is None and not is_ready(path):
        raise SystemExit("run `mlxcel fetch-model` first, or pass --model")

    blas = load_fast_blas()  # before anything imports mlx.core
    from mlxcel.model.mlx_load import load_mlx_model
    from mlxcel.model.prefix_cache import PrefixCache

    settings = Settings()
    loaded = load_mlx_model(
        path,
        name=path.name,
        max_batch=settings.parallel,
        prefill_step_size=settings.prefill_step_size,
        blas=blas,
        prompt_cache_bytes=settings.prompt_cache_bytes,
    )
    engine: Any = loaded.engine  # an MlxEngine; its prefix cache is swapped below
    print(describe(blas))
    print(f"{loaded.info.backend}; prefill step {settings.prefill_step_size} tokens")

    first = [{"role": "user", "content": "Explain this code:\n" + document(args.history)}]
    prompt = loaded.codec.render(first, None)
    print(f"first turn: {len(prompt)} prompt tokens, {args.reply} reply tokens")

    cold: list[float] = []
    warm: list[float] = []
    cached: list[int] = []
    follow_up: list[int] = []
    seq_ids = iter(range(1, 10_000))
    for _ in range(args.trials):
        engine.prefix_cache = PrefixCache(settings.prompt_cache_bytes)
        reply = answer(loaded, next(seq_ids), prompt, args.reply)
        history = [*first, {"role": "assistant", "content": reply}]
        history.append({"role": "user", "content": "And what does f_7 return for 3?"})
        follow_up = loaded.codec.render(history, None)
        cache_bytes = engine.prefix_cache.nbytes
        seconds, hit = first_token(loaded, next(seq_ids), follow_up)
        warm.append(seconds)
        cached.append(hit)
        engine.prefix_cache = None
        seconds, _ = first_token(loaded, next(seq_ids), follow_up)
        cold.append(seconds)
        engine.idle()

    print(f"follow-up turn: {len(follow_up)} prompt tokens, {min(cached)} from the cache")
    print(f"prefix cache after the first turn: {cache_bytes / 2**20:.1f} MiB")
    print(f"TTFT cold: median {statistics.median(cold):.2f} s  ({_list(cold)})")
    print(f"TTFT warm: median {statistics.median(warm):.2f} s  ({_list(warm)})")
    print(f"speed-up: {statistics.median(cold) / statistics.median(warm):.1f}x")
    engine.close()


def _list(values: list[float]) -> str:
    return ", ".join(f"{v:.2f}" for v in values)


if __name__ == "__main__":
    main()
