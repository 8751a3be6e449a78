"""The ceiling: mlx-lm's batched generation on the model, with no server around it.

For each batch size N it runs `mlx_lm.generate.batch_generate` on N of the serving
benchmark's prompts (64 output tokens each, the same BLAS, prefill step and batch
settings as `mlxcel-server --parallel N`) and prints prompt tokens/s, decode-only
tokens/s and end-to-end output tokens/s (prefill included). A server's aggregate
throughput at N streams is compared with the end-to-end figure; the decode-only one is
the bound when every prompt is already cached. Prints figures; asserts nothing.

    .venv/bin/python bench/engine.py [--levels 1,4,16,64] [--max-tokens 64]
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from prompts import TokenCounter, make_prompt

from mlxcel.model.provision.blas import describe, load_fast_blas
from mlxcel.model.provision.fetch import default_model_dir, is_ready


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", type=Path, default=None)
    parser.add_argument("--levels", default="1,4,16,64")
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--prefill-step-size", type=int, default=256)
    args = parser.parse_args()
    path = args.model or default_model_dir()
    if args.model is None and not is_ready(path):
        raise SystemExit("run `mlxcel fetch-model` first, or pass --model")

    blas = load_fast_blas()  # before anything imports mlx.core
    from mlx_lm.generate import batch_generate
    from mlx_lm.utils import load

    print(describe(blas))
    model, tokenizer = load(str(path))[:2]
    counter = TokenCounter(path)
    rows = []
    for n in [int(level) for level in args.levels.split(",")]:
        prompts = [
            tokenizer.apply_chat_template(
                [{"role": "user", "content": make_prompt(f"e{n}-{i}", counter)}],
                add_generation_prompt=True,
            )
            for i in range(n)
        ]
        started = time.perf_counter()
        result = batch_generate(
            model,
            tokenizer,
            prompts,
            max_tokens=args.max_tokens,
            completion_batch_size=n,
            prefill_batch_size=min(n, 8),
            prefill_step_size=args.prefill_step_size,
        )
        wall = time.perf_counter() - started
        stats = result.stats
        rows.append(
            {
                "n": n,
                "prompt_tokens": stats.prompt_tokens,
                "prompt_tps": stats.prompt_tps,
                "decode_tps": stats.generation_tps,
                "output_tokens": stats.generation_tokens,
                "end_to_end_tps": stats.generation_tokens / wall,
                "wall_s": wall,
            }
        )
    print("|  N | prompt tok/s | decode-only tok/s | end-to-end output tok/s | wall s |")
    print("|---:|-------------:|------------------:|------------------------:|-------:|")
    for r in rows:
        print(
            f"| {r['n']:>2} | {r['prompt_tps']:12.1f} | {r['decode_tps']:17.1f} "
            f"| {r['end_to_end_tps']:23.1f} | {r['wall_s']:6.1f} |"
        )
    print(json.dumps(rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
