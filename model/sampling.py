"""Choosing each row's next token from a batch of logits, and its log-probabilities.

Rows with the same settings are sampled in one call. Only what a row needs is computed:
greedy rows take an argmax, temperature rows sample from the scaled logits (the
distribution is the same normalised or not), and the vocabulary-wide normalisation
runs only for rows that asked for log-probabilities or use nucleus (top-p) sampling.

Import this module only on the model thread, after `load_fast_blas()`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import mlx.core as mx
from mlx_lm.sample_utils import make_sampler

from mlxcel.generation import Sampling
from mlxcel.items import TokenLogprob

LogSoftmax = Callable[[mx.array], mx.array]


def reference_log_softmax(logits: mx.array) -> mx.array:
    return logits - mx.logsumexp(logits, axis=-1, keepdims=True)


def _key(sampling: Sampling) -> tuple[float, float]:
    top_p = sampling.top_p if 0 < sampling.top_p < 1 and sampling.temperature > 0 else 0.0
    return (sampling.temperature if sampling.temperature > 0 else 0.0, top_p)


@dataclass
class Sampler:
    """Samples a batch; keeps one mlx-lm sampler per distinct setting."""

    log_softmax: LogSoftmax = reference_log_softmax
    _samplers: dict[tuple[float, float], Any] = field(default_factory=dict)

    def sample(
        self, logits: mx.array, rows: Sequence[Sampling]
    ) -> tuple[list[int], dict[int, mx.array]]:
        """The next token of every row of `logits` `[B, V]`, and the log-probability
        vectors `[V]` of the rows that asked for them (by row index)."""
        groups: dict[tuple[float, float], list[int]] = {}
        for i, sampling in enumerate(rows):
            groups.setdefault(_key(sampling), []).append(i)
        normalise = [i for i, s in enumerate(rows) if s.logprobs or _key(s)[1] > 0]
        normalised: dict[int, mx.array] = {}
        if normalise:
            part = self.log_softmax(logits[mx.array(normalise)])
            normalised = {i: part[n] for n, i in enumerate(normalise)}
        parts: list[tuple[list[int], mx.array]] = []
        for key, indices in groups.items():
            sampler = self._sampler(key)
            if key[1] > 0:
                inputs = mx.stack([normalised[i] for i in indices])
            elif len(indices) == len(rows):
                inputs = logits
            else:
                inputs = logits[mx.array(indices)]
            parts.append((indices, sampler(inputs)))
        mx.eval([tokens for _, tokens in parts])
        out = [0] * len(rows)
        for indices, tokens in parts:
            values: list[int] = tokens.tolist()  # type: ignore[assignment]
            for i, token in zip(indices, values, strict=True):
                out[i] = token
        return out, {i: normalised[i] for i in normalise if rows[i].logprobs}

    def _sampler(self, key: tuple[float, float]) -> Any:
        if key not in self._samplers:
            self._samplers[key] = make_sampler(temp=key[0], top_p=key[1])
        return self._samplers[key]


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
