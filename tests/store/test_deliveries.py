"""Pending webhook deliveries on every backend (memory, SQLite, Redis), in real time: a
claim takes each due delivery once and holds it for its lease, a delay is kept, a
settled delivery replaces or leaves, and the store keeps at most `MAX_PENDING`."""

from __future__ import annotations

import pytest
import trio

from mlxcel.store import deliveries as deliveries_module
from mlxcel.store import redis_deliveries, sqlite_deliveries
from mlxcel.store.actor import StoreActor, StoreHandle
from mlxcel.store.deliveries import Delivery
from mlxcel.store.limits import StoreLimits

from support import key_prefix

LIMITS = StoreLimits(10, 1 << 20, 0)


def delivery(n: int, **fields: object) -> Delivery:
    return Delivery(f"resp_{n}", f"evt_{n}", "tenant", **fields)  # type: ignore[arg-type]


async def store(nursery: trio.Nursery, store_spec: str) -> StoreHandle:
    """A store on `store_spec`'s backend, on Trio's clock (real time here)."""
    actor = StoreActor(LIMITS, LIMITS, 60, store=store_spec, key_prefix=key_prefix())
    handle: StoreHandle = await nursery.start(actor.run)
    return handle


async def test_a_claim_takes_a_due_delivery_once_until_its_lease_lapses(
    nursery: trio.Nursery, store_spec: str
) -> None:
    kept = (await store(nursery, store_spec)).deliveries
    assert await kept.add(delivery(1, status="completed", created_at=5), 0.0)
    assert await kept.claim(10, 0.3) == (delivery(1, status="completed", created_at=5),)
    assert await kept.claim(10, 0.3) == ()  # claimed: nobody else takes it meanwhile
    await trio.sleep(0.4)
    assert await kept.claim(10, 0.3) == (delivery(1, status="completed", created_at=5),)


async def test_a_delay_is_kept_and_a_settled_delivery_replaces_or_leaves(
    nursery: trio.Nursery, store_spec: str
) -> None:
    kept = (await store(nursery, store_spec)).deliveries
    await kept.add(delivery(1), 0.3)
    assert await kept.claim(10, 5.0) == ()
    await trio.sleep(0.4)
    (claimed,) = await kept.claim(10, 5.0)
    assert claimed == delivery(1)
    await kept.add(delivery(1, status="failed", attempts=1), 0.0)  # settled: due again now
    assert await kept.claim(10, 5.0) == (delivery(1, status="failed", attempts=1),)
    assert await kept.drop("resp_1")
    assert not await kept.drop("resp_1")
    assert not await kept.add(delivery(1, attempts=2), 0.0, settle=True)  # not brought back
    await trio.sleep(0.01)
    assert await kept.claim(10, 0.0) == ()


async def test_claims_take_the_earliest_first_up_to_the_limit_each_once(
    nursery: trio.Nursery, store_spec: str
) -> None:
    kept = (await store(nursery, store_spec)).deliveries
    for n in range(12):
        await kept.add(delivery(n), -1.0 + n / 100)  # all due, resp_0 the earliest
    first = await kept.claim(5, 10.0)
    assert [d.response_id for d in first] == [f"resp_{n}" for n in range(5)]
    taken: list[Delivery] = list(first)

    async def claim() -> None:
        taken.extend(await kept.claim(3, 10.0))

    async with trio.open_nursery() as claimers:  # concurrent claimers never share one
        for _ in range(5):
            claimers.start_soon(claim)
    assert sorted(d.response_id for d in taken) == sorted(f"resp_{n}" for n in range(12))


async def test_the_store_keeps_at_most_max_pending(
    nursery: trio.Nursery, store_spec: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    for module in (deliveries_module, sqlite_deliveries, redis_deliveries):
        monkeypatch.setattr(module, "MAX_PENDING", 3)
    kept = (await store(nursery, store_spec)).deliveries
    assert [await kept.add(delivery(n), 10.0) for n in range(4)] == [True, True, True, False]
    assert await kept.add(delivery(2, attempts=1), 10.0)  # a kept one may still be settled
    assert await kept.drop("resp_0")
    assert await kept.add(delivery(3), 10.0)
