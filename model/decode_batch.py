"""The decode batch: the running rows, in groups of like KV length, in reusable slots.

A batched KV state is one array per layer, `[slots, heads, length, dim]`, every row
left-padded to the longest. Changing which rows it holds by rebuilding it copies all of
it: measured on this engine's model, a 16-row state of ~400 tokens takes 70-300 ms to
rebuild on the CPU, as long as a decode step, and one row leaving or joining did that.
One state for every running row also made a long prompt's joining dear twice over: the
short rows were copied out to the long row's length (32 rows of ~300 tokens padded to
1,500 is a gigabyte of float32 written in one step), and every step after it attended
over the padding.

So rows decode in a few groups, each with its own batched state of slots:
- a row that ends leaves its slot **vacant**: nothing is copied; the slot still goes
  through the forward (one more token of a batch whose cost is reading the weights)
  but no logits are taken for it;
- a joining row goes to the group it pads least, if the group stays mostly real tokens,
  into a vacant slot when its prompt fits the group's length (one row's KV written in
  place), else the group is rebuilt with it; a row that fits no group starts one;
- a group rebuilt anyway drops its vacant slots; one with more vacant slots than rows
  is rebuilt without them, one with no rows is dropped;
- past `max_groups` the two groups that merge with the least padding merge.

The flattened forward (`flat_forward`) attends per group anyway, so a group costs a few
small operations a step, not a weight read. A model whose forward cannot be flattened
decodes its one state in its own forward: `max_groups` 1.

Import this module only on the model thread, after `load_fast_blas()`.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, Generic, Protocol, TypeVar

import mlx.core as mx

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
    slots: list[R | None]
    """The state's rows by slot; None: vacant."""
    cache: KV

    @property
    def live(self) -> list[int]:
        return [s for s, row in enumerate(self.slots) if row is not None]

    @property
    def rows(self) -> list[R]:
        return [row for row in self.slots if row is not None]

    @property
    def length(self) -> int:
        """Positions in the state: the longest row's, padding before the others."""
        return int(self.cache[0].size())


@dataclass
class DecodeBatch(Generic[R]):
    """Running rows and their KV states."""

    max_groups: int = MAX_GROUPS
    _groups: list[_Group[R]] = field(default_factory=list)

    @property
    def rows(self) -> list[R]:
        """Every row, in the order of the logits a step yields."""
        return [row for g in self._groups for row in g.rows]

    def __len__(self) -> int:
        return sum(len(g.live) for g in self._groups)

    def nbytes(self) -> int:
        return sum(forward.nbytes(g.cache) for g in self._groups)

    def groups(self) -> list[flat_forward.Group]:
        """One flattened-forward group per state: every slot feeds a token (a vacant
        one a dummy), logits are wanted for the rows only."""
        return [
            flat_forward.Group(
                [[0 if row is None else row.last] for row in g.slots],
                g.cache,
                [(s, 0) for s in g.live],
            )
            for g in self._groups
        ]

    def join(self, rows: Sequence[R], caches: Sequence[KV]) -> None:
        """Rows whose prompts are read, with their single-row KV states."""
        pending = sorted(zip(rows, caches, strict=True), key=lambda p: p[0].held)
        for cluster in _clusters(pending):
            group = self._host([r for r, _ in cluster])
            if group is not None:
                cluster = _fill_vacant(group, cluster)
            if not cluster:
                continue
            state = forward.merge([c for _, c in cluster])
            if group is None:
                self._groups.append(_Group([r for r, _ in cluster], state))
            else:
                _compact(group)
                group.cache = forward.extend(group.cache, state)
                group.slots.extend(r for r, _ in cluster)
        while len(self._groups) > self.max_groups:
            self._merge_closest()

    def keep(self, indices: Sequence[int]) -> None:
        """Keep the rows at `indices` (positions in `rows`); the others' slots are
        vacated."""
        wanted = set(indices)
        position = 0
        for g in self._groups:
            for s in g.live:
                if position not in wanted:
                    g.slots[s] = None
                position += 1
        self._groups = [g for g in self._groups if g.live]
        for g in self._groups:
            if len(g.slots) - len(g.live) > len(g.live):
                _compact(g)

    def extract(self, index: int) -> KV:
        """Row `index`'s (a position in `rows`) KV state, as a single-row state."""
        for g in self._groups:
            live = g.live
            if index < len(live):
                return forward.extract(g.cache, live[index])
            index -= len(live)
        raise IndexError(index)

    def clear(self) -> None:
        self._groups = []

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
            lengths = [r.held for k in pair for r in self._groups[k].rows]
            return _padded(lengths) - sum(lengths)

        i, j = min(pairs, key=waste)
        a, b = self._groups[i], self._groups[j]
        _compact(a)
        _compact(b)
        a.cache = forward.extend(a.cache, b.cache)
        a.slots.extend(b.slots)
        del self._groups[j]


def _fill_vacant(group: _Group[R], cluster: list[tuple[R, KV]]) -> list[tuple[R, KV]]:
    """Put the cluster's rows into the group's vacant slots where their states fit (no
    longer than the group's); the rows left over."""
    vacant = [s for s, row in enumerate(group.slots) if row is None]
    left: list[tuple[R, KV]] = []
    for row, cache in cluster:
        if vacant and row.held <= group.length:
            slot = vacant.pop(0)
            _write_slot(group.cache, slot, cache)
            group.slots[slot] = row
        else:
            left.append((row, cache))
    return left


def _write_slot(batch: KV, slot: int, single: KV) -> None:
    """A single-row state written into `slot` of a batched one, right-aligned to its
    length, the slot's padding and offset set to match; one row's KV is copied."""
    for layer, mine in zip(batch, single, strict=True):
        held = int(mine.offset)
        start = layer.size() - held
        layer.keys[slot : slot + 1, :, start : layer.size(), :] = mine.keys[..., :held, :]
        layer.values[slot : slot + 1, :, start : layer.size(), :] = mine.values[..., :held, :]
        layer.left_padding = _set(layer.left_padding, slot, start)
        layer.offset = _set(layer.offset, slot, held)


def _set(values: Any, index: int, value: int) -> Any:
    """`values` (a small int array) with `values[index] = value`."""
    out = values.tolist()
    out[index] = value
    return mx.array(out, dtype=values.dtype)


def _compact(group: _Group[Any]) -> None:
    """Rebuild the group's state without its vacant slots (a copy of the state)."""
    live = group.live
    if len(live) < len(group.slots):
        forward.keep_rows(group.cache, live)
        group.slots = [group.slots[s] for s in live]


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
