"""Choosing each row's next token from a batch of logits, and its log-probabilities.

The draw itself is numpy's (`draw.py`: greedy argmax, inverse CDF at a temperature,
exact top-p and top-k), on a zero-copy view of the evaluated logits, each row with its
own generator (`row_generator`). The vocabulary-wide normalisation runs in MLX, and only
for rows that asked for log-probabilities.

Import this module only on the model thread, after `load_fast_blas()`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import mlx.core as mx
import numpy as np

from mlxcel.generation import Sampling
from mlxcel.items import TokenLogprob
from mlxcel.model.draw import Rng, draw, row_generator

__all__ = [
    "LogSoftmax",
    "Rng",
    "Sampler",
    "reference_log_softmax",
    "row_generator",
    "token_logprob",
]

LogSoftmax = Callable[[mx.array], mx.array]


def reference_log_softmax(logits: mx.array) -> mx.array:
    return logits - mx.logsumexp(logits, axis=-1, keepdims=True)


@dataclass
class Sampler:
    """Samples a batch: tokens in numpy, log-probabilities in MLX."""

    log_softmax: LogSoftmax = reference_log_softmax

    def sample(
        self, logits: mx.array, rows: Sequence[Sampling], rngs: Sequence[Rng]
    ) -> tuple[list[int], dict[int, mx.array]]:
        """The next token of every row of `logits` `[B, V]`, each drawn with its own
        generator of `rngs`, and the log-probability vectors `[V]` of the rows that asked
        for them (by row index)."""
        if logits.dtype != mx.float32:
            logits = logits.astype(mx.float32)
        asked = [i for i, s in enumerate(rows) if s.logprobs]
        normalised: dict[int, mx.array] = {}
        if asked:
            part = self.log_softmax(logits if len(asked) == len(rows) else logits[mx.array(asked)])
            mx.eval(logits, part)
            normalised = {i: part[n] for n, i in enumerate(asked)}
        else:
            mx.eval(logits)
        return draw(np.asarray(logits), rows, rngs), normalised


def token_logprob(
    vector: mx.array, token: int, top: int, decode: Callable[[list[int]], str]
) -> TokenLogprob:
    """The token's log-probability and the `top` most likely alternatives."""
    alternatives: tuple[tuple[str, float], ...] = ()
    if top:
        ids = mx.argpartition(-vector, kth=top - 1)[:top]
        id_list: list[int] = ids.tolist()  # type: ignore[assignment]
        values: list[float] = vector[ids].tolist()  # type: ignore[assignment]
        pairs = sorted(zip(id_list, values, strict=True), key=lambda p: -p[1])
        alternatives = tuple((decode([i]), float(v)) for i, v in pairs)
    value: float = vector[token].item()  # type: ignore[assignment]
    return TokenLogprob(decode([token]), float(value), alternatives)
