"""OpenAI's `frequency_penalty`, `presence_penalty` and `logit_bias`, per row of a batch.

Each step, before a row's token is drawn, its logits become
`logit[t] + bias[t] - count[t] * frequency_penalty - (count[t] > 0) * presence_penalty`,
where `count[t]` is how many times this sequence generated token `t` so far (its prompt
does not count, as OpenAI defines the penalties). Only the rows that ask for one of them
carry a `RowPenalties`; the batch's logits are changed with one sparse scatter-add over
the (row, token) pairs that change, so a batch of rows without them takes the fast path
untouched and a penalised row costs its distinct generated tokens, not the vocabulary.

Import this module only on the model thread, after `load_fast_blas()`.
"""

from __future__ import annotations

from collections.abc import Sequence

import mlx.core as mx

from mlxcel.generation import Sampling


class RowPenalties:
    """One sequence's bias and the counts of the tokens it generated."""

    def __init__(self, sampling: Sampling) -> None:
        self._bias = dict(sampling.logit_bias)
        self._frequency = sampling.frequency_penalty
        self._presence = sampling.presence_penalty
        self._counts: dict[int, int] = {}

    @classmethod
    def for_sampling(cls, sampling: Sampling) -> RowPenalties | None:
        """Penalties for a sequence that asks for any; None (the fast path) otherwise."""
        return cls(sampling) if sampling.adjusts_logits else None

    def note(self, token: int) -> None:
        """The sequence generated `token`."""
        if self._frequency or self._presence:
            self._counts[token] = self._counts.get(token, 0) + 1

    def offsets(self) -> dict[int, float]:
        """What to add to each token's logit next step (tokens not named: nothing)."""
        out = dict(self._bias)
        for token, count in self._counts.items():
            out[token] = out.get(token, 0.0) - count * self._frequency - self._presence
        return out


def adjust(logits: mx.array, rows: Sequence[RowPenalties | None]) -> mx.array:
    """`logits` `[B, V]` with each row's penalties and bias applied (float32); the same
    array when no row has any. Ids past the logits' width are skipped (the edge refuses
    ids past the vocabulary, which the width covers)."""
    row_ids: list[int] = []
    token_ids: list[int] = []
    values: list[float] = []
    width = logits.shape[-1]
    for index, penalties in enumerate(rows):
        if penalties is None:
            continue
        for token, value in penalties.offsets().items():
            if 0 <= token < width and value:
                row_ids.append(index)
                token_ids.append(token)
                values.append(value)
    if not values:
        return logits
    if logits.dtype != mx.float32:
        logits = logits.astype(mx.float32)
    where = (mx.array(row_ids, dtype=mx.int32), mx.array(token_ids, dtype=mx.int32))
    return logits.at[where].add(mx.array(values, dtype=mx.float32))
