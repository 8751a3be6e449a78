"""The decode batch's groups: rows join the group they pad least, a long row gets its
own, and positions (`rows`, `keep`, `extract`) follow the rows wherever they sit.

Each row's KV state is a real mlx-lm cache of one small layer whose values say which
row and position they are, so a state that moved is checked by what it holds.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import pytest

from mlxcel.model.native.blas import load_fast_blas

if TYPE_CHECKING:
    from mlxcel.model.decode_batch import DecodeBatch

pytestmark = pytest.mark.mlx


@dataclass
class FakeRow:
    name: int
    held: int
    last: int = 0


def state(row: FakeRow) -> list[Any]:
    """One layer's single-row KV state: position p of row r holds r * 10_000 + p."""
    load_fast_blas()
    import mlx.core as mx
    from mlx_lm.models.cache import KVCache

    values = mx.arange(row.held, dtype=mx.float32) + row.name * 10_000
    kv = values.reshape(1, 1, row.held, 1)
    cache = KVCache()
    cache.update_and_fetch(kv, kv)
    return [cache]


def held_values(kv: list[Any]) -> list[float]:
    """What a single-row state holds."""
    cache = kv[0]
    return [float(x) for x in cache.keys[0, 0, : cache.offset, 0].tolist()]


def batch(max_groups: int = 4) -> DecodeBatch[FakeRow]:
    load_fast_blas()
    from mlxcel.model.decode_batch import DecodeBatch

    return DecodeBatch[FakeRow](max_groups=max_groups)


def join(b: DecodeBatch[FakeRow], rows: list[FakeRow]) -> None:
    b.join(rows, [state(r) for r in rows])


def names(b: DecodeBatch[FakeRow]) -> list[list[int]]:
    return [[r.name for r in g.rows] for g in b._groups]


def test_a_long_row_decodes_in_a_group_of_its_own() -> None:
    b = batch()
    short = [FakeRow(i, 300 + 7 * i) for i in range(4)]
    join(b, short)
    join(b, [FakeRow(9, 1500)])
    shapes = [g.shape for g in b.groups()]
    assert shapes == [(4, 1), (1, 1)]
    assert b._groups[0].cache[0].keys.shape[2] < 1500  # not padded to the long row


def test_rows_of_like_length_share_a_group() -> None:
    b = batch()
    join(b, [FakeRow(1, 300), FakeRow(2, 340)])
    join(b, [FakeRow(3, 500)])  # within one buffer step of the others
    join(b, [FakeRow(4, 1500), FakeRow(5, 1600)])  # like each other, not the first
    assert names(b) == [[1, 2, 3], [4, 5]]


def test_past_the_group_limit_the_closest_groups_merge() -> None:
    b = batch(max_groups=2)
    join(b, [FakeRow(1, 100)])
    join(b, [FakeRow(2, 2000)])
    join(b, [FakeRow(3, 5000)])
    assert names(b) == [[1], [2, 3]]


def test_positions_follow_the_rows_across_groups() -> None:
    b = batch()
    rows = [FakeRow(1, 300), FakeRow(2, 1500), FakeRow(3, 320), FakeRow(4, 1510)]
    for r in rows:
        join(b, [r])
    order = [r.name for r in b.rows]
    assert sorted(order) == [1, 2, 3, 4]
    for i, name in enumerate(order):
        row = next(r for r in rows if r.name == name)
        assert held_values(b.extract(i)) == held_values(state(row))
    b.keep([i for i, name in enumerate(order) if name in (1, 4)])
    assert sorted(r.name for r in b.rows) == [1, 4]
    assert len(b._groups) == 2
    for i, row in enumerate(b.rows):
        assert held_values(b.extract(i)) == held_values(state(row))
    b.keep([])
    assert len(b) == 0
    assert b.groups() == []


def test_a_row_that_ends_leaves_its_slot_vacant_and_a_joining_row_takes_it() -> None:
    b = batch()
    rows = [FakeRow(i, 300 + 10 * i) for i in range(4)]
    join(b, rows)
    b.keep([0, 2, 3])  # row 1 ends: nothing is copied
    (group,) = b._groups
    assert group.slots[1] is None
    assert [w for w in b.groups()[0].want] == [(0, 0), (2, 0), (3, 0)]
    before = group.cache[0].keys
    newcomer = FakeRow(7, 250)
    join(b, [newcomer])
    assert group.slots[1] is newcomer
    assert group.cache[0].keys.shape == before.shape  # written in place, not rebuilt
    assert [r.name for r in b.rows] == [0, 7, 2, 3]
    for i, row in enumerate(b.rows):
        assert held_values(b.extract(i)) == held_values(state(row))


def test_a_group_mostly_vacant_is_rebuilt_and_an_empty_one_dropped() -> None:
    b = batch()
    join(b, [FakeRow(i, 300) for i in range(5)])
    join(b, [FakeRow(9, 2000)])
    b.keep([0, 1, 2])  # rows 3, 4 and 9 end
    assert [len(g.slots) for g in b._groups] == [5]
    b.keep([0])  # four of five vacant: rebuilt with its one row
    assert [len(g.slots) for g in b._groups] == [1]
    assert held_values(b.extract(0)) == held_values(state(FakeRow(0, 300)))
