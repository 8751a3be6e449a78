"""The decode batch: the running rows, in groups of like KV length.

A batched KV state is one array per layer, `[rows, heads, length, dim]`, every row
left-padded to the longest. One state for every running row makes a long prompt's
joining expensive twice over: the short rows are copied out to the long row's length
(32 rows of ~300 tokens padded to 1,500 is a gigabyte of float32 to write), and every
step after it attends over the padding. A row's leaving copies the whole state too.

So rows decode in a few groups, each with its own batched state, joined by length: a
row joins the group it pads least, if the group stays mostly real tokens, else starts
one. The flattened forward (`flat_forward`) attends per group anyway, so a group costs
a few more small operations a step, not another weight read. Past `max_groups` the two
groups that merge with the least padding are merged. A model whose forward cannot be
flattened decodes in its own forward over one state: `max_groups` 1.

Import this module only on the model thread, after `load_fast_blas()`.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Generic, Protocol, TypeVar

from mlxcel.model import flat_forward, forward
from mlxcel.model.forward import KV


class Running(Protocol):
    """What the batch needs of a row."""

    @property
    def last(self) -> int:
        """The token the next decode step feeds."""

    @property
    def held(self) -> int:
        """Tokens in the row's KV state."""


R = TypeVar("R", bound=Running)

MAX_GROUPS = 4
"""Groups decoding at once: each adds its attention's small operations to a step."""
PAD_SLACK = 1.5
"""A group's padded length times its rows may be at most this times its real tokens..."""
PAD_FREE = 256
"""...unless its rows' lengths differ by no more than this (one KV buffer step)."""


@dataclass
class _Group(Generic[R]):
    rows: list[R]
    cache: KV


@dataclass
class DecodeBatch(Generic[R]):
    """Running rows and their KV states."""

    max_groups: int = MAX_GROUPS
    _groups: list[_Group[R]] = field(default_factory=list)

    @property
    def rows(self) -> list[R]:
        """Every row, in the order of `groups` (and of the logits a step yields)."""
        return [row for g in self._groups for row in g.rows]

    def __len__(self) -> int:
        return sum(len(g.rows) for g in self._groups)

    def nbytes(self) -> int:
        return sum(forward.nbytes(g.cache) for g in self._groups)

    def groups(self) -> list[flat_forward.Group]:
        """One flattened-forward group per state, each row feeding its last token."""
        return [
            flat_forward.Group(
                [[r.last] for r in g.rows], g.cache, [(i, 0) for i in range(len(g.rows))]
            )
            for g in self._groups
        ]

    def join(self, rows: Sequence[R], caches: Sequence[KV]) -> None:
        """Rows whose prompts are read, with their single-row KV states."""
        pending = sorted(zip(rows, caches, strict=True), key=lambda p: p[0].held)
        for cluster in _clusters(pending):
            group = self._host([r for r, _ in cluster])
            state = forward.merge([c for _, c in cluster])
            if group is None:
                self._groups.append(_Group([r for r, _ in cluster], state))
            else:
                group.cache = forward.extend(group.cache, state)
                group.rows.extend(r for r, _ in cluster)
        while len(self._groups) > self.max_groups:
            self._merge_closest()

    def keep(self, indices: Sequence[int]) -> None:
        """Keep the rows at `indices` (positions in `rows`), drop the others."""
        wanted = set(indices)
        start, kept = 0, []
        for g in self._groups:
            local = [i for i in range(len(g.rows)) if start + i in wanted]
            start += len(g.rows)
            if len(local) == len(g.rows):
                kept.append(g)
            elif local:
                g.rows = [g.rows[i] for i in local]
                forward.keep_rows(g.cache, local)
                kept.append(g)
        self._groups = kept

    def extract(self, index: int) -> KV:
        """Row `index`'s (a position in `rows`) KV state, as a single-row state."""
        group, local = self._locate(index)
        return forward.extract(group.cache, local)

    def clear(self) -> None:
        self._groups = []

    def _locate(self, index: int) -> tuple[_Group[R], int]:
        for g in self._groups:
            if index < len(g.rows):
                return g, index
            index -= len(g.rows)
        raise IndexError(index)

    def _host(self, rows: Sequence[R]) -> _Group[R] | None:
        """The group these rows pad least, if it stays dense with them (else None)."""
        best: tuple[int, _Group[R]] | None = None
        for g in self._groups:
            lengths = [r.held for r in (*g.rows, *rows)]
            if not _dense(lengths):
                continue
            waste = _padded(lengths) - sum(lengths)
            if best is None or waste < best[0]:
                best = (waste, g)
        return None if best is None else best[1]

    def _merge_closest(self) -> None:
        """Merge the two groups whose merged state pads least."""
        pairs = [(i, j) for i in range(len(self._groups)) for j in range(i + 1, len(self._groups))]

        def waste(pair: tuple[int, int]) -> int:
            a, b = (self._groups[k] for k in pair)
            lengths = [r.held for r in (*a.rows, *b.rows)]
            return _padded(lengths) - sum(lengths)

        i, j = min(pairs, key=waste)
        a, b = self._groups[i], self._groups[j]
        a.cache = forward.extend(a.cache, b.cache)
        a.rows.extend(b.rows)
        del self._groups[j]


def _padded(lengths: Sequence[int]) -> int:
    return max(lengths) * len(lengths)


def _dense(lengths: Sequence[int]) -> bool:
    """Whether one state for rows of these lengths would be mostly real tokens."""
    return max(lengths) - min(lengths) <= PAD_FREE or _padded(lengths) <= PAD_SLACK * sum(lengths)


def _clusters(pending: Sequence[tuple[R, KV]]) -> Iterator[list[tuple[R, KV]]]:
    """Joining rows (sorted by length) cut into runs that are dense together."""
    run: list[tuple[R, KV]] = []
    for item in pending:
        if run and not _dense([r.held for r, _ in (*run, item)]):
            yield run
            run = []
        run.append(item)
    if run:
        yield run
