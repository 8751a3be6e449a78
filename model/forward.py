"""The model's forwards, as the engine runs them: a decode step and a prompt chunk.

A decode step feeds one token per running row against the rows' batched KV state. A
prompt chunk feeds up to `length` tokens per row, right-padded, against KV states that
are merged for the forward and handed back one per row, and yields logits only at the
positions asked for (a prompt's last token): the vocabulary-wide head is the dearest
single matrix product of a forward, and every other position would be thrown away.

Import this module only on the model thread, after `load_fast_blas()`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import mlx.core as mx

KV = list[Any]
"""One sequence's (or one batch's) KV state: a cache object per layer, mlx-lm's kinds."""


def merge(caches: Sequence[KV]) -> KV:
    """One batched KV state from single-row ones (left-padded to the longest)."""
    return [layer[0].merge(list(layer)) for layer in zip(*caches, strict=True)]


def extend(batch: KV | None, rows: KV) -> KV:
    """`batch` with the batched `rows` appended (`rows` itself when there is no batch)."""
    if batch is None:
        return rows
    for mine, theirs in zip(batch, rows, strict=True):
        mine.extend(theirs)
    return batch


def extract(batch: KV, index: int) -> KV:
    """Row `index` of a batched KV state, as a single-row state of its own."""
    return [layer.extract(index) for layer in batch]


def keep_rows(batch: KV, indices: list[int]) -> KV | None:
    """`batch` cut down to the rows at `indices` (None when none is left)."""
    if not indices:
        return None
    for layer in batch:
        layer.filter(indices)
    return batch


def nbytes(cache: KV | None) -> int:
    return 0 if cache is None else sum(int(layer.nbytes) for layer in cache)


def decode_logits(model: Any, tokens: list[int], cache: KV) -> mx.array:
    """Logits `[B, V]` of the next token of every row, each row having fed one token."""
    inputs = mx.array(tokens, dtype=mx.uint32)[:, None]
    logits: mx.array = model(inputs, cache=cache)
    return logits[:, -1, :]


def read_chunk(
    model: Any, rows: Sequence[Sequence[int]], caches: Sequence[KV], want: Sequence[bool]
) -> tuple[list[KV], dict[int, mx.array]]:
    """Feed each row's tokens (right-padded to the longest) after its KV state.

    Returns every row's KV state with the tokens added, and the logits `[V]` after the
    last token of each row `i` with `want[i]`. One row runs on its own state (no
    padding, no copies); several are merged into one batched state for the forward and
    extracted again.
    """
    length = max(len(r) for r in rows)
    padded = [list(r) + [0] * (length - len(r)) for r in rows]
    inputs = mx.array(padded, dtype=mx.uint32)
    single = len(rows) == 1
    cache = caches[0] if single else merge(caches)
    padding = [length - len(r) for r in rows]
    if not single and max(padding) > 0:
        for layer in cache:
            layer.prepare(lengths=[len(r) for r in rows], right_padding=padding)
    hidden = _hidden(model, inputs, cache)
    if not single and max(padding) > 0:
        for layer in cache:
            layer.finalize()
    wanted = [i for i, w in enumerate(want) if w]
    logits: dict[int, mx.array] = {}
    if wanted:
        last = mx.array([len(rows[i]) - 1 for i in wanted])
        picked = hidden[mx.array(wanted), last][:, None, :]  # [W, 1, H]
        head = _head(model, picked)[:, 0, :]
        logits = {i: head[n] for n, i in enumerate(wanted)}
    out = [cache] if single else [extract(cache, i) for i in range(len(rows))]
    mx.eval([layer.state for kv in out for layer in kv], list(logits.values()))
    return out, logits


def _hidden(model: Any, inputs: mx.array, cache: KV) -> mx.array:
    """The last hidden states `[B, L, H]`, or the logits when the model cannot split."""
    inner = getattr(model, "model", None)
    if inner is not None and _has_head(model):
        return inner(inputs, cache=cache)  # type: ignore[no-any-return]
    return model(inputs, cache=cache)  # type: ignore[no-any-return]


_PLAIN_HEADS = frozenset({"llama", "mistral", "qwen2", "qwen3"})
"""Model types whose logits are exactly the head applied to the inner model's output."""


def _has_head(model: Any) -> bool:
    if getattr(model, "model_type", None) not in _PLAIN_HEADS:
        return False
    args = getattr(model, "args", None)
    tied = bool(getattr(args, "tie_word_embeddings", False))
    return hasattr(model, "lm_head") or (tied and hasattr(model.model, "embed_tokens"))


def _head(model: Any, hidden: mx.array) -> mx.array:
    if not (getattr(model, "model", None) is not None and _has_head(model)):
        return hidden  # `_hidden` already gave logits
    if hasattr(model, "lm_head"):
        return model.lm_head(hidden)  # type: ignore[no-any-return]
    return model.model.embed_tokens.as_linear(hidden)  # type: ignore[no-any-return]
