"""Attention and SwiGLU on the CPU: mlx-lm's own ops, today's composed CPU forms, numpy, and
the compiled kernels (``model/native/attn_kernel.c`` as MLX primitives), at the default model's
shapes (Qwen2.5-Coder-0.5B: 14 query heads, 2 KV heads, width 64; MLP 4864).

Per call, medians of ``--repeats`` evaluations (the machine may be shared):

- attention of a prompt chunk, L = 256 queries at S = 512, 2k, 4k and 8k keys, and decode
  rows, L = 1 at B = 1, 16 and 64 over S = 512 and 2k keys, with the boolean masks the
  engine's batched KV cache passes; ms per call and ns per score (B * 14 * L * S scores);
- SwiGLU over the MLP's activations, ns per element;
- with ``--model``: one prompt read of 512, 4,000 and 8,000 tokens on the default model in
  512-token chunks (as the engine reads it), tokens/s with the kernels and without (the
  composed forms), and the long reads' rate as a share of the short one's.

The numpy column is attention as numpy would do it on zero-copy views of evaluated MLX
arrays (OpenBLAS products, numpy's exp, in place), the result copied back into MLX: the
alternative to a compiled kernel (the evaluation it forces per layer is not counted).

    .venv/bin/python bench/attention.py [--repeats 7] [--model [--read-repeats 3]] [--quick]
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from mlxcel.model.native.blas import load_fast_blas

load_fast_blas()  # before mlx.core is imported below

import mlx.core as mx  # noqa: E402
from mlx_lm.models.base import create_causal_mask  # noqa: E402

from mlxcel.model.native import kernels  # noqa: E402
from mlxcel.model.native.cpu_forms import (  # noqa: E402
    REFERENCE_SDPA,
    REFERENCE_SWIGLU,
    composed_forms,
    fast_sdpa,
    fast_swiglu,
)

HEADS, KV_HEADS, DIM, MLP = 14, 2, 64, 4864
SCALE = DIM**-0.5


def median_seconds(run: Callable[[], Any], repeats: int) -> float:
    """Median wall time of `run` evaluated to completion, after one warm-up call."""
    mx.eval(run())
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        mx.eval(run())
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def numpy_attention(q: np.ndarray, k: np.ndarray, v: np.ndarray, additive: np.ndarray) -> mx.array:
    """Attention in numpy on views of MLX arrays: grouped heads as one product per KV head,
    the mask added (converted once per forward, as the composed forms do), exp in place,
    the result back into MLX."""
    batch, heads, q_len, dim = q.shape
    rep = heads // k.shape[1]
    qg = q.reshape(batch, k.shape[1], rep * q_len, dim) * SCALE
    scores = qg @ k.swapaxes(-1, -2)  # [B, Hkv, rep * L, S]
    scores = scores.reshape(batch, k.shape[1], rep, q_len, -1)
    scores += additive[:, :, None]
    scores -= scores.max(axis=-1, keepdims=True)
    np.exp(scores, out=scores)
    total = scores.sum(axis=-1, keepdims=True)
    out = scores.reshape(batch, k.shape[1], rep * q_len, -1) @ v
    return mx.array((out.reshape(batch, k.shape[1], rep, q_len, dim) / total).reshape(q.shape))


def settle() -> None:
    """Let BLAS threads that spin after a product (numpy's OpenBLAS, MLX's) go to sleep
    before the next column is timed: they would take the cores from it."""
    time.sleep(0.3)


def attention_row(batch: int, q_len: int, k_len: int, repeats: int) -> dict[str, float]:
    """Seconds per call of each way, for one shape (numpy for prompt chunks only: per
    decode step it would cost an evaluation per layer, ~0.1 ms, more than the attention)."""
    keys = mx.random.split(mx.random.key(k_len + q_len + batch), 3)
    q = mx.random.normal((batch, HEADS, q_len, DIM), key=keys[0])
    k = mx.random.normal((batch, KV_HEADS, k_len, DIM), key=keys[1])
    v = mx.random.normal((batch, KV_HEADS, k_len, DIM), key=keys[2])
    left = mx.zeros((batch,), mx.int32)
    mask = create_causal_mask(q_len, offset=k_len - q_len, left_padding=left)
    mx.eval(q, k, v, mask)
    row = {}
    if kernels.current_module() is not None:
        row["kernel"] = median_seconds(lambda: fast_sdpa(q, k, v, None, SCALE, mask), repeats)
    settle()
    row["mlx-lm"] = median_seconds(
        lambda: REFERENCE_SDPA(q, k, v, cache=None, scale=SCALE, mask=mask), repeats
    )
    settle()
    with composed_forms():
        row["forms"] = median_seconds(lambda: fast_sdpa(q, k, v, None, SCALE, mask), repeats)
    if q_len > 1:
        settle()
        qn, kn, vn = (np.array(a, copy=False) for a in (q, k, v))
        additive = np.where(np.array(mask), 0.0, np.finfo(np.float32).min).astype(np.float32)
        row["numpy"] = median_seconds(lambda: numpy_attention(qn, kn, vn, additive), repeats)
    settle()
    return row


def swiglu_row(rows: int, repeats: int) -> dict[str, float]:
    keys = mx.random.split(mx.random.key(rows), 2)
    gate = mx.random.normal((rows, MLP), key=keys[0]) * 3.0
    up = mx.random.normal((rows, MLP), key=keys[1])
    mx.eval(gate, up)
    row = {}
    if kernels.current_module() is not None:
        row["kernel"] = median_seconds(lambda: fast_swiglu(gate, up), repeats)
    row["mlx-lm"] = median_seconds(lambda: REFERENCE_SWIGLU(gate, up), repeats)
    with composed_forms():
        row["forms"] = median_seconds(lambda: fast_swiglu(gate, up), repeats)
    gn, un = np.array(gate, copy=False), np.array(up, copy=False)
    row["numpy"] = median_seconds(lambda: mx.array(gn / (1.0 + np.exp(-gn)) * un), repeats)
    settle()
    return row


WAYS = ("mlx-lm", "forms", "numpy", "kernel")


def print_attention(quick: bool, repeats: int) -> None:
    shapes = [(1, 256, s) for s in ((512, 2048) if quick else (512, 2048, 4096, 8192))]
    shapes += [(b, 1, s) for b in (1, 16, 64) for s in ((2048,) if quick else (512, 2048))]
    print("\n## Attention (boolean causal masks), ms per call / ns per score\n")
    print("| B | L | S | " + " | ".join(WAYS) + " | kernel vs forms |")
    print("|---|---|---|" + "---|" * (len(WAYS) + 1))
    for batch, q_len, k_len in shapes:
        row = attention_row(batch, q_len, k_len, repeats)
        scores = batch * HEADS * q_len * k_len
        cells = [
            f"{row[w] * 1e3:.2f} / {row[w] * 1e9 / scores:.2f}" if w in row else "-" for w in WAYS
        ]
        gain = f"{row['forms'] / row['kernel']:.1f}x" if "kernel" in row else "-"
        print(f"| {batch} | {q_len} | {k_len} | " + " | ".join(cells) + f" | {gain} |")


def print_swiglu(repeats: int) -> None:
    print(f"\n## SwiGLU ([rows, {MLP}]), ns per element\n")
    print("| rows | " + " | ".join(WAYS) + " |")
    print("|---|" + "---|" * len(WAYS))
    for rows in (1, 16, 64, 256):
        row = swiglu_row(rows, repeats)
        cells = [f"{row[w] * 1e9 / (rows * MLP):.2f}" if w in row else "-" for w in WAYS]
        print(f"| {rows} | " + " | ".join(cells) + " |")


def prompt_tokens(tokens: int) -> list[int]:
    """A deterministic token sequence of ordinary text ids (the read does not care)."""
    rng = np.random.default_rng(tokens)
    return [int(t) for t in rng.integers(1000, 30000, size=tokens)]


def read_rate(model: Any, tokens: list[int], chunk: int = 512) -> float:
    """Tokens/s of one prompt read in `chunk`-token forwards on a batched KV cache."""
    from mlx_lm.models.cache import BatchKVCache

    caches = [BatchKVCache([0]) for _ in model.layers]
    start = time.perf_counter()
    for at in range(0, len(tokens), chunk):
        logits = model(mx.array([tokens[at : at + chunk]]), cache=caches)
        mx.eval(logits[:, -1], [c.state for c in caches])
    return len(tokens) / (time.perf_counter() - start)


def print_model_reads(repeats: int) -> None:
    from mlx_lm.utils import load

    from mlxcel.model.native.cpu_forms import install_cpu_forms
    from mlxcel.model.native.qmm import install_quantized_forms
    from mlxcel.model.provision.fetch import default_model_dir

    model = load(str(default_model_dir()))[0]
    install_quantized_forms(model)
    install_cpu_forms(model)
    read_rate(model, prompt_tokens(600))  # warm-up
    print(
        f"\n## A prompt read on the default model (512-token chunks), tokens/s, median of {repeats}\n"
    )
    print("| prompt tokens | kernels | composed forms | kernels vs forms | kernels vs 512 tokens |")
    print("|---|---|---|---|---|")
    short = 0.0
    for size in (512, 4000, 8000):
        tokens = prompt_tokens(size)
        fast = statistics.median(read_rate(model, tokens) for _ in range(repeats))
        short = short or fast
        with composed_forms():
            slow = statistics.median(read_rate(model, tokens) for _ in range(repeats))
        print(f"| {size} | {fast:.1f} | {slow:.1f} | {fast / slow:.2f}x | {fast / short:.2f} |")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=7, help="timed calls per cell")
    parser.add_argument("--model", action="store_true", help="also time real prompt reads")
    parser.add_argument("--quick", action="store_true", help="fewer shapes")
    parser.add_argument("--read-repeats", type=int, default=1, help="prompt reads per cell")
    args = parser.parse_args(argv)
    status = kernels.load_kernels()
    print(f"CPU kernels: {status.describe()}")
    print_attention(args.quick, args.repeats)
    print_swiglu(args.repeats)
    if args.model:
        print_model_reads(args.read_repeats)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
