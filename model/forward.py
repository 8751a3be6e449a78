"""The model's forwards, as the engine runs them: a decode step and a prompt chunk.

A decode step feeds one token per running row against the rows' batched KV state. A
prompt chunk feeds up to `length` tokens per row, right-padded, against KV states that
are merged for the forward and handed back one per row, and yields logits only at the
positions asked for (a prompt's last token): the vocabulary-wide head is the dearest
single matrix product of a forward, and every other position would be thrown away.

Import this module only on the model thread, after `load_fast_blas()`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
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


@dataclass
class Chunk:
    """Prompt rows set up for one forward: `tokens` right-padded to one length, and the
    KV state they are read into (a row's own, or the rows' merged one)."""

    tokens: list[list[int]]
    lengths: list[int]
    cache: KV
    single: bool
    padded: bool

    def want(self, flags: Sequence[bool]) -> list[tuple[int, int]]:
        """`(row, position)` of the last token of every row `i` with `flags[i]`."""
        return [(i, self.lengths[i] - 1) for i, flag in enumerate(flags) if flag]


def open_chunk(rows: Sequence[Sequence[int]], caches: Sequence[KV]) -> Chunk:
    """Set up rows of prompt tokens to be read after their KV states.

    One row runs on its own state (no padding, no copies); several are merged into one
    batched state, told about the right padding of the shorter rows.
    """
    length = max(len(r) for r in rows)
    tokens = [list(r) + [0] * (length - len(r)) for r in rows]
    single = len(rows) == 1
    cache = caches[0] if single else merge(caches)
    padding = [length - len(r) for r in rows]
    padded = not single and max(padding) > 0
    if padded:
        for layer in cache:
            layer.prepare(lengths=[len(r) for r in rows], right_padding=padding)
    return Chunk(tokens, [len(r) for r in rows], cache, single, padded)


def close_chunk(chunk: Chunk) -> list[KV]:
    """Every row's KV state with its tokens added (after the forward is built)."""
    if chunk.padded:
        for layer in chunk.cache:
            layer.finalize()
    return (
        [chunk.cache]
        if chunk.single
        else [extract(chunk.cache, i) for i in range(len(chunk.tokens))]
    )


def read_chunk(
    model: Any, rows: Sequence[Sequence[int]], caches: Sequence[KV], want: Sequence[bool]
) -> tuple[list[KV], dict[int, mx.array]]:
    """Feed each row's tokens (right-padded to the longest) after its KV state.

    Returns every row's KV state with the tokens added, and the logits `[V]` after the
    last token of each row `i` with `want[i]`.
    """
    chunk = open_chunk(rows, caches)
    hidden = _hidden(model, mx.array(chunk.tokens, dtype=mx.uint32), chunk.cache)
    pairs = chunk.want(want)
    logits: dict[int, mx.array] = {}
    if pairs:
        index = mx.array([i for i, _ in pairs]), mx.array([p for _, p in pairs])
        head = _head(model, hidden[index][:, None, :])[:, 0, :]  # [W, V]
        logits = {i: head[n] for n, (i, _) in enumerate(pairs)}
    out = close_chunk(chunk)
    mx.eval([layer.state for kv in out for layer in kv], list(logits.values()))
    return out, logits


def _hidden(model: Any, inputs: mx.array, cache: KV) -> mx.array:
    """The last hidden states `[B, L, H]`, or the logits when the model cannot split."""
    if head_of(model) is not None:
        return model.model(inputs, cache=cache)  # type: ignore[no-any-return]
    return model(inputs, cache=cache)  # type: ignore[no-any-return]


_PLAIN_HEADS = frozenset({"llama", "mistral", "qwen2", "qwen3"})
"""Model types whose logits are exactly the head applied to the inner model's output."""


def head_of(model: Any) -> Callable[[mx.array], mx.array] | None:
    """The vocabulary head the model applies to its inner model's output (its own
    `lm_head`, or the tied embedding as a linear map); None when the logits are not
    exactly that (another architecture: only the whole model gives them)."""
    inner = getattr(model, "model", None)
    if inner is None or getattr(model, "model_type", None) not in _PLAIN_HEADS:
        return None
    if hasattr(model, "lm_head"):
        return model.lm_head  # type: ignore[no-any-return]
    args = getattr(model, "args", None)
    if bool(getattr(args, "tie_word_embeddings", False)) and hasattr(inner, "embed_tokens"):
        return inner.embed_tokens.as_linear  # type: ignore[no-any-return]
    return None


def _head(model: Any, hidden: mx.array) -> mx.array:
    head = head_of(model)
    return hidden if head is None else head(hidden)  # without a head `_hidden` gave logits
