"""The store actor's limits, on Trio's fake clock."""

from __future__ import annotations

import pytest
import trio
import trio.testing

from mlxcel.actors.store import StoreActor, StoreHandle, approx_json_size
from mlxcel.config import StoreLimits
from mlxcel.items import InputText, Message, RequestEcho, ResponseRecord


def record(rid: str, text: str = "x") -> ResponseRecord:
    return ResponseRecord(
        id=rid, created_at=0, status="completed", echo=RequestEcho(model="m"),
        output=(Message("assistant", (InputText(text),)),),
    )


async def start(nursery: trio.Nursery, limits: StoreLimits) -> StoreHandle:
    handle: StoreHandle = await nursery.start(StoreActor(limits).run)
    return handle


async def test_put_get_delete(nursery: trio.Nursery) -> None:
    store = await start(nursery, StoreLimits(10, 1 << 20, 0))
    assert await store.put(record("a"))
    assert (await store.get("a")) == record("a")
    assert await store.delete("a")
    assert await store.get("a") is None
    assert not await store.delete("a")


async def test_entries_limit_evicts_least_recently_used(nursery: trio.Nursery) -> None:
    store = await start(nursery, StoreLimits(2, 1 << 20, 0))
    await store.put(record("a"))
    await store.put(record("b"))
    assert await store.get("a") is not None  # a is now the most recently used
    await store.put(record("c"))
    assert await store.get("b") is None
    assert await store.get("a") is not None
    assert await store.get("c") is not None


async def test_ttl_expires_on_the_fake_clock(
    nursery: trio.Nursery, autojump_clock: trio.testing.MockClock
) -> None:
    store = await start(nursery, StoreLimits(10, 1 << 20, 60))
    await store.put(record("a"))
    await trio.sleep(59)
    assert await store.get("a") is not None
    await trio.sleep(2)
    assert await store.get("a") is None


async def test_ttl_zero_never_expires(
    nursery: trio.Nursery, autojump_clock: trio.testing.MockClock
) -> None:
    store = await start(nursery, StoreLimits(10, 1 << 20, 0))
    await store.put(record("a"))
    await trio.sleep(10**7)
    assert await store.get("a") is not None


async def test_byte_budget(nursery: trio.Nursery) -> None:
    size = approx_json_size(record("a"))
    store = await start(nursery, StoreLimits(10, 2 * size, 0))
    await store.put(record("a"))
    await store.put(record("b"))
    await store.put(record("c"))
    assert await store.get("a") is None  # evicted to make room
    assert await store.get("c") is not None
    # Replacing an id does not count it twice.
    await store.put(record("c"))
    assert await store.get("b") is not None


async def test_entry_exactly_at_budget_is_kept_larger_is_not(nursery: trio.Nursery) -> None:
    size = approx_json_size(record("a"))
    store = await start(nursery, StoreLimits(10, size, 0))
    assert await store.put(record("a"))
    assert not await store.put(record("b", "much longer text"))
    assert await store.get("b") is None
    assert await store.get("a") is not None


@pytest.mark.parametrize("limits", [StoreLimits(0, 1 << 20, 0), StoreLimits(10, 0, 0)])
async def test_disabled_or_zero_budget_keeps_nothing(
    nursery: trio.Nursery, limits: StoreLimits
) -> None:
    store = await start(nursery, limits)
    assert not await store.put(record("a"))
    assert await store.get("a") is None
