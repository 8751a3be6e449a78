"""Drawing each row's next token from its logits, in numpy, exactly and cheaply.

MLX's CPU backend computes `exp` with scalar code (~13.5 ns an element on x86) and
mlx-lm's sampler draws with Gumbel noise over the whole vocabulary (a log, an exp and
a uniform per logit), and sorts the whole vocabulary for top-p. numpy's vectorised
`exp` costs ~0.5 ns, and an evaluated MLX array is read here without a copy. So a row
at temperature T > 0 is drawn by inverse CDF:

- `p = exp((l - max) / T)`, one exp per logit, into a row-sized scratch buffer;
- the mass of each block of `BLOCK` tokens, their running sum, one uniform draw
  `u · total`, and a binary search: first for the block, then inside it. The token
  drawn is the first whose cumulative mass exceeds the target, so a token of zero
  mass (a grammar's -inf) is never drawn; rounding at the very end falls back to the
  last token of positive mass.

**top_p and top_k keep what the server did with mlx-lm's `make_sampler`**: the
nucleus is taken from the *untempered* (temperature 1) distribution, top-k from the
logits' order (which no temperature changes), and the row is then drawn at its
temperature from the tokens both keep (mlx-lm applies `apply_top_p` to the
log-probabilities, then `apply_top_k`, then divides by the temperature). Hugging Face
and vLLM temper first; a client that sends top_p < 1 with a temperature other than 1
gets mlx-lm's reading, as before.

**Ties.** Both filters are thresholds on the logit, so the kept set does not depend on
how equal logits are ordered: the nucleus is every token whose logit is at least that
of the last token of the shortest prefix, in descending order, whose mass reaches
`top_p` of the row's (mlx-lm's `apply_top_p` rule: tokens tied with that last token
are all kept); top-k is every token whose logit is at least the k-th largest (as
Hugging Face's `TopKLogitsWarper`: ties at the k-th are all kept, so a tie can keep
more than k). Both keep the intersection. Masked (-inf) tokens are never kept.

**The top-p pre-filter** sorts only tokens that can be inside the nucleus: the `k`
largest logits (`argpartition`), sorted, whose running mass is searched for the
boundary; when it is not among them `k` grows (at least by the tokens the missing mass
needs, none outside being heavier than the k-th; the first time also to a size
estimated from a sample of the row) and the search repeats. The running mass of the
sorted candidates is the same sum, in the same order, as a full sort's prefix, so the
boundary is the one a full sort finds; the guesses only decide how much is sorted.

**Seeds.** Each row draws with its own `numpy.random.Generator` (`row_generator`),
one uniform per step, so a seeded request repeats its tokens whatever is batched
beside it. Greedy rows (temperature 0) take the argmax and draw nothing; a row with no
finite logit (cannot happen with a grammar that allows something) takes the argmax too.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TypeAlias

import numpy as np
import numpy.typing as npt

from mlxcel.generation import Sampling

BLOCK = 1024
"""Tokens per block of the inverse CDF: the running sum is over ~V / BLOCK block masses,
and the final search over one block's."""

FIRST_CANDIDATES = 128
"""The top-p pre-filter's first guess of the nucleus size."""

SAMPLE_STRIDE = 16
"""Its second guess comes from every 16th token's mass (a flat row's nucleus can be tens
of thousands of tokens; growing by fixed factors would partition the row many times)."""

Floats = npt.NDArray[np.float32]
Indices = npt.NDArray[np.intp]
Rng: TypeAlias = np.random.Generator

_PROCESS = np.random.default_rng()
"""Seeds the generators of requests without a seed (from the OS's entropy at import)."""


def row_generator(seed: int | None = None) -> Rng:
    """A sequence's own generator: from its `seed` when given (any integer; taken modulo
    2**64, as the engine's seeds are unsigned 64-bit), else a fresh stream of the
    process-wide generator."""
    if seed is None:
        return _PROCESS.spawn(1)[0]
    return np.random.default_rng(seed % 2**64)


def draw(logits: Floats, rows: Sequence[Sampling], rngs: Sequence[Rng]) -> list[int]:
    """The next token of every row of `logits` `[B, V]` (float32), each row by its own
    settings and generator."""
    buf = np.empty(logits.shape[-1], dtype=np.float32)
    return [
        draw_row(logits[i], sampling, rng, buf)
        for i, (sampling, rng) in enumerate(zip(rows, rngs, strict=True))
    ]


def draw_row(row: Floats, sampling: Sampling, rng: Rng, buf: Floats) -> int:
    """One token from `row` `[V]` (`buf` is `[V]` float32 scratch space)."""
    if sampling.temperature <= 0:
        return int(np.argmax(row))
    top = float(row.max())
    if not np.isfinite(top):  # all masked (or a NaN/inf logit): nothing to draw from
        return int(np.argmax(row))
    u = float(rng.random())
    top_p, top_k = _filters(sampling, row.shape[0])
    scale = 1.0 / sampling.temperature
    if top_p >= 1.0 and not top_k:
        return _inverse_cdf(row, top, scale, buf, u)
    kept = keep(row, top_p, top_k, buf)
    weights = np.exp((row[kept].astype(np.float64) - top) * scale)
    return int(kept[_pick(weights, u)])


def _filters(sampling: Sampling, vocab: int) -> tuple[float, int]:
    """(top_p, top_k) in effect: top_p outside (0, 1) and top_k outside (0, V) are off."""
    top_p = sampling.top_p if 0.0 < sampling.top_p < 1.0 else 1.0
    top_k = sampling.top_k if 0 < sampling.top_k < vocab else 0
    return top_p, top_k


def _inverse_cdf(row: Floats, top: float, scale: float, buf: Floats, u: float) -> int:
    """The token where `u` of the row's tempered mass is reached: block masses first,
    then the cumulative mass inside the block found."""
    np.subtract(row, np.float32(top), out=buf)
    if scale != 1.0:
        np.multiply(buf, np.float32(scale), out=buf)
    np.exp(buf, out=buf)
    vocab = buf.shape[0]
    full = vocab // BLOCK
    sums = np.empty(full + (1 if vocab % BLOCK else 0), dtype=np.float64)
    sums[:full] = buf[: full * BLOCK].reshape(full, BLOCK).sum(axis=1)
    if vocab % BLOCK:
        sums[full] = buf[full * BLOCK :].sum()
    running = np.cumsum(sums)
    target = u * float(running[-1])
    block = _pick_at(running, sums, target)
    lo = block * BLOCK
    inside = target - (float(running[block - 1]) if block else 0.0)
    part = buf[lo : lo + BLOCK]
    return lo + _pick_at(np.cumsum(part, dtype=np.float64), part, inside)


def _pick(weights: npt.NDArray[np.float64], u: float) -> int:
    """The index where `u` of `weights`' total is reached."""
    running = np.cumsum(weights)
    return _pick_at(running, weights, u * float(running[-1]))


def _pick_at(
    running: npt.NDArray[np.float64], weights: npt.NDArray[np.floating], target: float
) -> int:
    """The first index whose running mass exceeds `target` (it has positive mass, since
    the one before does not exceed it); past the end (rounding), the last of positive
    mass."""
    i = int(np.searchsorted(running, target, side="right"))
    if i < running.shape[0]:
        return i
    return int(np.flatnonzero(weights > 0)[-1])


def keep(row: Floats, top_p: float, top_k: int, buf: Floats) -> Indices:
    """The tokens (ascending ids) top_p and top_k leave to draw from (see the module's
    docstring for the rule); `top_p` 1 and `top_k` 0 are off, not both."""
    vocab = row.shape[0]
    need = 0.0
    if top_p < 1.0:
        np.subtract(row, row.max(), out=buf)
        np.exp(buf, out=buf)  # the untempered distribution (unnormalised)
        need = top_p * float(buf.sum())
    k = top_k or min(FIRST_CANDIDATES, vocab)
    while True:
        order = _largest(row, k)
        size = k  # top-k alone, or the nucleus holds all k (with top_k: the smaller set)
        if top_p >= 1.0:
            break
        running = np.cumsum(buf[order], dtype=np.float64)
        end = int(np.searchsorted(running, need, side="left")) + 1
        if end <= k or top_k or k == vocab:
            size = min(end, k)
            break
        k = _more(buf, order, need - float(running[-1]), top_p, first=k == FIRST_CANDIDATES)
    return _at_least(row, order, size)


def _more(buf: Floats, order: Indices, missing: float, top_p: float, *, first: bool) -> int:
    """How many of the largest to take next when `order`'s mass is `missing` short: at
    least the tokens that mass needs (none outside is heavier than `order`'s last), 4
    times as many as before, and after the first guess the nucleus size estimated from
    every `SAMPLE_STRIDE`-th token; a quarter of the row or more is the whole row."""
    vocab, k = buf.shape[0], order.shape[0]
    heaviest_left = float(buf[order[-1]])
    wanted = k + (int(missing / heaviest_left) + 1 if heaviest_left > 0 else vocab)
    more = max(4 * k, 2 * wanted - k)
    if first:
        sample = np.sort(buf[::SAMPLE_STRIDE])[::-1]
        running = np.cumsum(sample, dtype=np.float64)
        inside = int(np.searchsorted(running, top_p * float(running[-1]))) + 1
        more = max(more, inside * SAMPLE_STRIDE * 5 // 4 + FIRST_CANDIDATES)
    return int(vocab if more > vocab // 4 else more)  # a full sort costs little more by then


def _largest(row: Floats, k: int) -> Indices:
    """The ids of the `k` largest logits, in descending order of logit."""
    vocab = row.shape[0]
    if k == vocab:
        return np.argsort(-row)  # the order of ties does not matter (see `keep`)
    ids = np.argpartition(row, vocab - k)[vocab - k :]
    return ids[np.argsort(-row[ids])]


def _at_least(row: Floats, order: Indices, size: int) -> Indices:
    """Every unmasked token whose logit is at least that of `order[size - 1]`, ascending
    (`order`: the k largest, descending). Tokens outside `order` can tie only with its
    last, so the whole row is searched only then."""
    threshold = row[order[size - 1]]
    if threshold > row[order[-1]] or order.shape[0] == row.shape[0]:
        ids = order[row[order] >= threshold]
    else:
        ids = np.flatnonzero(row >= threshold)
    return np.sort(ids[row[ids] > -np.inf])
