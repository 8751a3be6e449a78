"""One forward per step against two: a decode batch and a prompt chunk, on the real model.

For each shape (B decode rows at ~C tokens of context, beside a one-row prompt chunk
of P tokens starting at position S), it times, alternating, the two separate forwards
the engine ran before (`forward.decode_logits`, then `forward.read_chunk`) and the
flattened one (`flat_forward.step_logits`), from identical KV states, and prints the
medians and what one forward saves. Prints figures; asserts nothing.

    .venv/bin/python bench/flat_step.py [--repeats 5] [--shapes 1x32,16x64,64x64,16x256,16x256@2048]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from dataclasses import dataclass
from typing import Any

from mlxcel.model.native.blas import describe, load_fast_blas
from mlxcel.model.provision.fetch import default_model_dir

CONTEXT = 150
"""Tokens each decode row has seen (a chat turn's prompt and some output)."""


@dataclass(frozen=True)
class Shape:
    rows: int
    chunk: int
    start: int = 0

    @classmethod
    def parse(cls, text: str) -> Shape:
        head, _, start = text.partition("@")
        rows, chunk = head.split("x")
        return cls(int(rows), int(chunk), int(start or 0))

    def __str__(self) -> str:
        return f"B={self.rows}, chunk {self.chunk} at {self.start}"


def states(model: Any, shape: Shape) -> tuple[Any, Any]:
    """A decode batch with about `CONTEXT` tokens per row, and the chunk row's state."""
    from mlx_lm.models.cache import make_prompt_cache

    from mlxcel.model import forward

    lengths = [CONTEXT - i % 7 for i in range(shape.rows)]
    tokens = [[(31 * i + 7 * j) % 1000 for j in range(n)] for i, n in enumerate(lengths)]
    caches = [make_prompt_cache(model) for _ in lengths]
    rows, _ = forward.read_chunk(model, tokens, caches, [False] * len(lengths))
    chunk_cache = make_prompt_cache(model)
    if shape.start:
        forward.read_chunk(model, [[7] * shape.start], [chunk_cache], [False])
    return forward.merge(rows), chunk_cache


def two_forwards(model: Any, shape: Shape) -> float:
    import mlx.core as mx

    from mlxcel.model import forward

    batch, chunk = states(model, shape)
    started = time.perf_counter()
    logits = forward.decode_logits(model, [1] * shape.rows, batch)
    mx.eval(logits)
    forward.read_chunk(model, [[3] * shape.chunk], [chunk], [True])
    return time.perf_counter() - started


def one_forward(model: Any, shape: Shape) -> float:
    import mlx.core as mx

    from mlxcel.model import flat_forward, forward

    batch, chunk = states(model, shape)
    started = time.perf_counter()
    opened = forward.open_chunk([[3] * shape.chunk], [chunk])
    groups = [
        flat_forward.Group([[1]] * shape.rows, batch, [(i, 0) for i in range(shape.rows)]),
        flat_forward.Group(opened.tokens, opened.cache, opened.want([True])),
    ]
    logits, firsts = flat_forward.step_logits(model, groups)
    caches = forward.close_chunk(opened)
    mx.eval(logits, firsts, [layer.state for kv in caches for layer in kv])
    return time.perf_counter() - started


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--shapes", default="1x32,16x64,64x64,16x256,16x256@2048")
    args = p.parse_args(argv)
    blas = load_fast_blas()
    from mlx_lm.utils import load

    from mlxcel.model.native.cpu_forms import install_cpu_forms
    from mlxcel.model.native.qmm import install_quantized_forms

    model = load(str(default_model_dir()))[0]
    install_cpu_forms(model)
    install_quantized_forms(model)
    print(f"{describe(blas)}; decode rows at ~{CONTEXT} tokens of context")
    print("| shape | two forwards ms | one forward ms | saved ms | ratio |")
    print("|---|---:|---:|---:|---:|")
    for shape in (Shape.parse(s) for s in args.shapes.split(",")):
        one_forward(model, shape)  # warm up the shapes
        two, one = [], []
        for _ in range(args.repeats):
            two.append(two_forwards(model, shape))
            one.append(one_forward(model, shape))
        a, b = statistics.median(two) * 1e3, statistics.median(one) * 1e3
        print(f"| {shape} | {a:.0f} | {b:.0f} | {a - b:.0f} | {a / b:.2f} |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
