"""Where a forward step's time goes, by op class, with mlx-lm's ops and with the CPU forms.

Cases: a B=64 decode step at ~150 tokens of context (left-padded batch cache, bool
masks) and 256-token prefill chunks at positions 0, 2k and 8k (one sequence). Each
case times the whole forward (plus sampling for decode), then each op class in
isolation with the real shapes, every layer's worth, with ``mx.eval`` between pieces;
the forward minus the sum of the pieces is reported as "other" (Python, graph
building, reshapes, copies). Caches are filled with random keys and values: the cost
does not depend on their contents. Prints figures; asserts nothing.

    .venv/bin/python bench/profile_step.py [--cases decode64,prefill0,prefill2k,prefill8k]
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mlxcel.model.native.blas import describe, load_fast_blas
from mlxcel.model.provision.fetch import default_model_dir, is_ready

CASES = {"decode64": (64, 1, 150), "prefill0": (1, 256, 0), "prefill2k": (1, 256, 2048)}
CASES["prefill8k"] = (1, 256, 8192)
CLASSES = ("weight GEMMs", "attention matmuls", "softmax + mask", "activations")
CLASSES += ("norms/RoPE/elementwise", "sampling", "KV-cache updates", "other")


def clock(fn: Callable[[], Any], repeats: int) -> float:
    import mlx.core as mx

    mx.eval(fn())
    started = time.perf_counter()
    for _ in range(repeats):
        mx.eval(fn())
    return (time.perf_counter() - started) / repeats * 1e3


def make_caches(model: Any, batch: int, context: int, count: int = 0) -> list[Any]:
    import mlx.core as mx
    from mlx_lm.models.cache import BatchKVCache, KVCache

    attn = model.layers[0].self_attn
    head_dim = model.args.hidden_size // attn.n_heads
    caches: list[Any] = []
    for _ in range(count or len(model.layers)):
        cache: Any = BatchKVCache([i % 8 for i in range(batch)]) if batch > 1 else KVCache()
        if context:
            shape = (batch, attn.n_kv_heads, context, head_dim)
            cache.update_and_fetch(mx.random.normal(shape), mx.random.normal(shape))
        caches.append(cache)
    mx.eval([c.state for c in caches])
    return caches


def time_forward(
    model: Any, batch: int, length: int, context: int, repeats: int, fast: bool
) -> float:
    """Milliseconds of the whole forward (plus sampling for decode), the best of `repeats`
    after one untimed run."""
    import mlx.core as mx

    from mlxcel.model.native.cpu_forms import fast_log_softmax

    tokens = mx.random.randint(0, model.args.vocab_size, (batch, length))

    def forward() -> Any:
        caches = make_caches(model, batch, context)
        started = time.perf_counter()
        logits = model(tokens, cache=caches)[:, -1, :]
        out = [logits]
        if length == 1:
            logprobs = fast_log_softmax(logits) if fast else logits - mx.logsumexp(logits, -1, True)
            out += [mx.argmax(logprobs, -1), mx.random.categorical(logprobs)]
        mx.eval(out)
        return time.perf_counter() - started

    forward()
    return min(forward() for _ in range(repeats)) * 1e3


def uses_cpu_forms() -> bool:
    """Whether mlx-lm's qwen2 currently runs the CPU forms (not the reference ops)."""
    from mlx_lm.models import qwen2

    from mlxcel.model.native.cpu_forms import fast_swiglu

    return vars(qwen2)["swiglu"] is fast_swiglu


@dataclass
class Pieces:
    """Random inputs of one layer's ops, at the case's real shapes."""

    batch: int
    length: int
    context: int
    x: Any
    q4: Any
    k4: Any
    v4: Any
    qg: Any
    scores: Any
    mask: Any
    gate: Any
    up: Any

    @property
    def total(self) -> int:
        return self.context + self.length

    @property
    def kv(self) -> int:
        return int(self.k4.shape[1])

    @property
    def rep(self) -> int:
        return int(self.q4.shape[1]) // self.kv


def make_pieces(model: Any, batch: int, length: int, context: int) -> Pieces:
    import mlx.core as mx

    args, attn = model.args, model.layers[0].self_attn
    hidden, inter, heads, kv = (
        args.hidden_size,
        args.intermediate_size,
        attn.n_heads,
        attn.n_kv_heads,
    )
    head_dim, total = hidden // heads, context + length
    x = mx.random.normal((batch, length, hidden))
    q4 = mx.random.normal((batch, heads, length, head_dim))
    k4 = mx.random.normal((batch, kv, total, head_dim))
    v4 = mx.random.normal((batch, kv, total, head_dim))
    rep = heads // kv
    qg = q4.reshape(batch, kv, rep * length, head_dim)
    scores = mx.random.normal((batch, kv, rep, length, total))
    mask = (
        make_caches(model, batch, context, count=1)[0].make_mask(length) if batch > 1 else "causal"
    )
    gate, up = mx.random.normal((batch, length, inter)), mx.random.normal((batch, length, inter))
    mx.eval(x, q4, k4, v4, qg, scores, gate, up)
    return Pieces(batch, length, context, x, q4, k4, v4, qg, scores, mask, gate, up)


def softmax_op(p: Pieces, fast: bool) -> Callable[[], Any]:
    """The attention softmax with its mask applied: the CPU form's or mlx-lm's."""
    import mlx.core as mx

    def softmax() -> Any:
        from mlxcel.model.native.cpu_forms import _additive_mask, _exp_shifted

        if fast:
            add = _additive_mask(p.mask, p.length, p.total)
            s = p.scores if add is None else p.scores + (add[:, :, None] if add.ndim == 4 else add)
            e = _exp_shifted(s, mx.max(s, -1, keepdims=True))
            return [e, mx.sum(e, -1, keepdims=True)]
        m = p.mask
        if isinstance(m, str):
            m = mx.arange(p.total - p.length, p.total)[:, None] >= mx.arange(p.total)[None]
        m = m[:, :, None] if m.ndim == 4 else m
        return mx.softmax(mx.where(m, p.scores, -3e38), -1, precise=True)

    return softmax


def layer_costs(model: Any, p: Pieces, repeats: int, fast: bool) -> dict[str, float]:
    """Milliseconds of each op class over every layer, the lm head's GEMM included."""
    import mlx.core as mx
    from mlx_lm.models import qwen2

    layer, n = model.layers[0], len(model.layers)
    attn, mlp, norm = layer.self_attn, layer.mlp, layer.input_layernorm
    x, batch, length, kv, rep = p.x, p.batch, p.length, p.kv, p.rep

    def gemms() -> Any:
        a = attn
        return [
            a.q_proj(x),
            a.k_proj(x),
            a.v_proj(x),
            a.o_proj(x),
            mlp.gate_proj(x),
            mlp.up_proj(x),
        ]

    def kv_update() -> float:  # the update alone, not the cache's construction
        cache = make_caches(model, batch, p.context, count=1)[0]
        started = time.perf_counter()
        mx.eval(cache.update_and_fetch(p.k4[:, :, :length], p.v4[:, :, :length]))
        return (time.perf_counter() - started) * 1e3

    costs = {
        "weight GEMMs": n * (clock(gemms, repeats) + clock(lambda: mlp.down_proj(p.gate), repeats)),
        "attention matmuls": n
        * (
            clock(lambda: p.qg @ p.k4.swapaxes(-1, -2), repeats)
            + clock(lambda: p.scores.reshape(batch, kv, rep * length, p.total) @ p.v4, repeats)
        ),
        "softmax + mask": n * clock(softmax_op(p, fast), repeats),
        "activations": n * clock(lambda: qwen2.swiglu(p.gate, p.up), repeats),
        "norms/RoPE/elementwise": n
        * clock(lambda: [norm(x), norm(x + x), attn.rope(p.q4, offset=p.context), x + x], repeats),
        "KV-cache updates": n * min(kv_update() for _ in range(repeats + 1)),
    }
    head = model.lm_head if hasattr(model, "lm_head") else model.model.embed_tokens.as_linear
    costs["weight GEMMs"] += clock(lambda: head(x[:, -1:]), repeats)
    return costs


def sampling_cost(model: Any, batch: int, repeats: int, fast: bool) -> float:
    """Milliseconds of sampling one token per row from random logits."""
    import mlx.core as mx

    from mlxcel.model.native.cpu_forms import fast_log_softmax

    def sampling() -> Any:
        logits = mx.random.normal((batch, model.args.vocab_size))
        lp = fast_log_softmax(logits) if fast else logits - mx.logsumexp(logits, -1, True)
        return [mx.argmax(lp, -1), mx.random.categorical(lp)]

    return clock(sampling, repeats)


def profile(model: Any, batch: int, length: int, context: int, repeats: int) -> dict[str, float]:
    fast = uses_cpu_forms()
    whole = time_forward(model, batch, length, context, repeats, fast)
    costs = layer_costs(model, make_pieces(model, batch, length, context), repeats, fast)
    if length == 1:
        costs["sampling"] = sampling_cost(model, batch, repeats, fast)
    costs["other"] = whole - sum(costs.values())
    return {"whole": whole, **costs}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", type=Path, default=None)
    parser.add_argument("--cases", default=",".join(CASES))
    parser.add_argument("--repeats", type=int, default=2)
    args = parser.parse_args()
    path = args.model or default_model_dir()
    if args.model is None and not is_ready(path):
        raise SystemExit("run `mlxcel fetch-model` first, or pass --model")

    blas = load_fast_blas()  # before anything imports mlx.core
    from mlx_lm.utils import load

    from mlxcel.model.native.cpu_forms import install_cpu_forms, reference_forms

    print(describe(blas))
    model = load(str(path))[0]
    assert install_cpu_forms(model), "the CPU forms did not install (not on the CPU?)"
    for case in args.cases.split(","):
        batch, length, context = CASES[case]
        with reference_forms():
            before = profile(model, batch, length, context, args.repeats)
        after = profile(model, batch, length, context, args.repeats)
        print(f"\n{case}: B={batch}, {length} new tokens after {context} (ms per forward)\n")
        print("| op class | mlx-lm ops | CPU forms | speed-up |")
        print("|---|---:|---:|---:|")
        for name in ("whole", *CLASSES):
            b, a = before.get(name, 0.0), after.get(name, 0.0)
            ratio = f"{b / a:.2f}x" if a > 0.5 and b > 0.5 else ""
            print(f"| {name} | {b:.1f} | {a:.1f} | {ratio} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
