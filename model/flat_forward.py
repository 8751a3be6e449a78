"""One forward for a whole engine step: the decode rows' tokens and a prompt chunk's.

Every forward reads all the weights, whatever it computes: on a CPU that is a fixed
cost as large as a one-row decode step. A step that decodes and also reads a prompt
chunk in two forwards pays it twice. Here the position-independent work (embedding,
norms, the QKV and output projections, the MLP, the head) runs once over the step's
tokens laid end to end, `[1, T, H]`; only attention, which depends on each sequence's
past, runs per group: the decode rows against the decode batch's KV state, the chunk's
rows against theirs, each with the mask its cache makes. vLLM's chunked prefill and
llama.cpp's unified batch work the same way.

It is written on mlx-lm's own modules (each layer's submodules called in the order its
block calls them), for the architectures whose blocks are exactly `h = x +
attn(norm(x)); out = h + mlp(norm(h))` with the usual attention: qwen2, qwen3 and llama
without sliding-window layers. :func:`supports` says whether a model is one; the engine
runs separate forwards for any other.

Import this module only on the model thread, after `load_fast_blas()`.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import mlx.core as mx
from mlx_lm.models.base import create_attention_mask

from mlxcel.model.forward import KV, decode_logits, head_of
from mlxcel.model.native.fused_layer import FusedLayers

_BLOCKS = frozenset({"mlx_lm.models.qwen2", "mlx_lm.models.qwen3", "mlx_lm.models.llama"})
"""Modules whose transformer blocks and attention this forward reproduces."""


@dataclass(frozen=True, slots=True)
class Group:
    """Rows that share a KV state: `tokens[i]` is row i's input, all rows `length` long
    (the chunk's shorter rows right-padded, which the cache was told with `prepare`);
    logits are wanted at `(row, position)` for each pair of `want`."""

    tokens: Sequence[Sequence[int]]
    cache: KV
    want: Sequence[tuple[int, int]]

    @property
    def shape(self) -> tuple[int, int]:
        return len(self.tokens), len(self.tokens[0])


def supports(model: Any) -> bool:
    """Whether `model`'s forward can be flattened (else: one forward per group)."""
    inner = getattr(model, "model", None)
    layers = getattr(inner, "layers", None)
    if not layers or head_of(model) is None:
        return False
    if any(getattr(layer, "use_sliding", False) for layer in layers):
        return False
    return all(type(layer).__module__ in _BLOCKS for layer in layers) and all(
        hasattr(layer, "self_attn") and hasattr(layer.self_attn, "rope") for layer in layers
    )


def step_logits(
    model: Any, groups: Sequence[Group], fused: FusedLayers | None = None
) -> list[mx.array]:
    """One forward over every group's tokens; the logits `[W, V]` each group wants.

    With `fused` (`native/fused_layer.py`), each layer's work around attention is two
    native nodes instead of mlx-lm's modules; the same numbers within float rounding.
    The groups' caches are updated in place, as the separate forwards would update them.
    Lazy: nothing is evaluated here.
    """
    inner = model.model
    embedded = [
        inner.embed_tokens(mx.array([list(r) for r in g.tokens], dtype=mx.uint32)) for g in groups
    ]
    masks = [create_attention_mask(e, g.cache[0]) for e, g in zip(embedded, groups, strict=True)]
    h = mx.concatenate([e.reshape(1, -1, e.shape[-1]) for e in embedded], axis=1)
    bounds = _bounds(groups)
    if fused is not None:
        h = _fused_layers(fused, inner.layers, h[0], groups, bounds, masks)[None]
    for index, layer in enumerate(inner.layers if fused is None else ()):
        attn = layer.self_attn
        x = layer.input_layernorm(h)
        q, k, v = attn.q_proj(x), attn.k_proj(x), attn.v_proj(x)
        parts = [
            _attend(attn, q[:, lo:hi], k[:, lo:hi], v[:, lo:hi], g, index, mask)
            for g, (lo, hi), mask in zip(groups, bounds, masks, strict=True)
        ]
        h = h + attn.o_proj(parts[0] if len(parts) == 1 else mx.concatenate(parts, axis=1))
        h = h + layer.mlp(layer.post_attention_layernorm(h))
    h = inner.norm(h)
    head = head_of(model)
    assert head is not None
    out: list[mx.array] = []
    for g, (lo, _) in zip(groups, bounds, strict=True):
        length = g.shape[1]
        flat = [lo + row * length + pos for row, pos in g.want]
        out.append(head(h[:, mx.array(flat)])[0] if flat else mx.zeros((0,)))
    return out


def _bounds(groups: Sequence[Group]) -> list[tuple[int, int]]:
    """Each group's token span in the flattened step."""
    spans: list[tuple[int, int]] = []
    start = 0
    for g in groups:
        rows, length = g.shape
        spans.append((start, start + rows * length))
        start += rows * length
    return spans


def _attend(
    attn: Any, q: mx.array, k: mx.array, v: mx.array, group: Group, index: int, mask: Any
) -> mx.array:
    """One group's attention in layer `index`, as the layer's own `__call__` computes it."""
    rows, length = group.shape
    cache = group.cache[index]
    q = q.reshape(rows, length, attn.n_heads, -1)
    k = k.reshape(rows, length, attn.n_kv_heads, -1)
    v = v.reshape(rows, length, attn.n_kv_heads, -1).transpose(0, 2, 1, 3)
    if hasattr(attn, "q_norm"):  # qwen3 normalises each head before the rotation
        q, k = attn.q_norm(q), attn.k_norm(k)
    q = attn.rope(q.transpose(0, 2, 1, 3), offset=cache.offset)
    k = attn.rope(k.transpose(0, 2, 1, 3), offset=cache.offset)
    k, v = cache.update_and_fetch(k, v)
    # The name the model's own module calls: the CPU forms rebind it there.
    sdpa = sys.modules[type(attn).__module__].scaled_dot_product_attention
    out: mx.array = sdpa(q, k, v, cache=cache, scale=attn.scale, mask=mask)
    return out.transpose(0, 2, 1, 3).reshape(1, rows * length, -1)


def _fused_layers(
    fused: FusedLayers,
    layers: Sequence[Any],
    h: mx.array,
    groups: Sequence[Group],
    bounds: Sequence[tuple[int, int]],
    masks: Sequence[Any],
) -> mx.array:
    """Every layer on `h` `[T, H]` with the fused head and tail; attention per group."""
    positions = _positions(groups)  # read before layer 0's cache moves on
    for index, layer in enumerate(layers):
        attn = layer.self_attn
        sdpa = sys.modules[type(attn).__module__].scaled_dot_product_attention
        qkv = fused.head(index, h, positions)
        parts = []
        for g, (lo, hi), mask in zip(groups, bounds, masks, strict=True):
            rows, length = g.shape
            cache = g.cache[index]
            q, k, v = (_heads_first(a if len(groups) == 1 else a[lo:hi], rows, length) for a in qkv)
            k, v = cache.update_and_fetch(k, v)
            out = sdpa(q, k, v, cache=cache, scale=attn.scale, mask=mask)
            parts.append(_tokens_first(out))
        h = fused.tail(index, h, parts[0] if len(parts) == 1 else mx.concatenate(parts))
    return h


def _heads_first(a: mx.array, rows: int, length: int) -> mx.array:
    """`[rows * length, heads, D]` as attention reads it, `[rows, heads, length, D]`."""
    if length == 1:  # a decode row: the same memory, one node fewer
        return a.reshape(rows, a.shape[1], 1, a.shape[2])
    return a.reshape(rows, length, *a.shape[1:]).transpose(0, 2, 1, 3)


def _tokens_first(out: mx.array) -> mx.array:
    """Attention's `[rows, heads, length, D]` as `[rows * length, heads * D]`."""
    rows, heads, length, dim = out.shape
    if length == 1:
        return out.reshape(rows, heads * dim)
    return out.transpose(0, 2, 1, 3).reshape(rows * length, heads * dim)


def _positions(groups: Sequence[Group]) -> mx.array:
    """Each token's position in its sequence (int32 `[T]`), from its group's cache offset."""
    spans = []
    for g in groups:
        rows, length = g.shape
        offset = g.cache[0].offset  # an int, or one per row (`BatchKVCache`)
        steps = mx.arange(length, dtype=mx.int32)[None]
        if isinstance(offset, int):
            spans.append(mx.broadcast_to(steps + offset, (rows, length)).reshape(-1))
        else:
            spans.append((offset.astype(mx.int32)[:, None] + steps).reshape(-1))
    return spans[0] if len(spans) == 1 else mx.concatenate(spans)


def one_group_logits(model: Any, group: Group, fused: FusedLayers | None) -> mx.array:
    """One decode state's logits (the fused layers' when there are), for its rows' slots."""
    if fused is not None:
        return step_logits(model, [group], fused)[0]
    logits = decode_logits(model, [t[0] for t in group.tokens], group.cache)
    live = [slot for slot, _ in group.want]
    return logits if len(live) == len(group.tokens) else logits[mx.array(live)]


def joined(parts: list[mx.array]) -> mx.array:
    """The decode groups' logits as one `[B, V]`, in the batch's row order."""
    return parts[0] if len(parts) == 1 else mx.concatenate(parts)
