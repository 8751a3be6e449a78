"""Pending webhook deliveries on every backend (memory, SQLite, Redis), in real time: a
claim takes each due delivery once and holds it for its lease, and at most each tenant's
room; a delay is kept, a settled delivery replaces or leaves, and the store keeps at most
`MAX_PENDING`, a tenant at most its share; what an earlier release kept is read."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest
import trio

import mlxcel.store.redis.deliveries as redis_deliveries
import mlxcel.store.sqlite.deliveries as sqlite_deliveries
from mlxcel.store import deliveries as deliveries_module
from mlxcel.store.actor import StoreActor, StoreHandle
from mlxcel.store.deliveries import Added, Delivery, encode_delivery
from mlxcel.store.limits import StoreLimits

from redis_server import RedisServer
from support import key_prefix

LIMITS = StoreLimits(10, 1 << 20, 0)


def delivery(n: int, **fields: object) -> Delivery:
    return Delivery(f"resp_{n}", f"evt_{n}", "tenant", **fields)  # type: ignore[arg-type]


def of(tenant: str, n: int, **fields: object) -> Delivery:
    return Delivery(f"resp_{tenant}{n}", f"evt_{tenant}{n}", tenant, **fields)  # type: ignore[arg-type]


async def store(nursery: trio.Nursery, store_spec: str, prefix: str | None = None) -> StoreHandle:
    """A store on `store_spec`'s backend, on Trio's clock (real time here)."""
    actor = StoreActor(LIMITS, LIMITS, 60, store=store_spec, key_prefix=prefix or key_prefix())
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


async def test_an_end_made_known_is_never_made_due_again_by_another(
    nursery: trio.Nursery, store_spec: str
) -> None:
    """A job's end and a recheck that read it both make the delivery known: the first
    does, and the second leaves it (claimed by the attempt sending it) as it is."""
    kept = (await store(nursery, store_spec)).deliveries
    await kept.add(delivery(1), 10.0)
    known = delivery(1, status="completed", created_at=5)
    assert await kept.add(known, 0.0, settle=True, unknown_only=True) is Added.KEPT
    assert await kept.claim(10, 10.0) == (known,)  # an attempt sends it
    later = delivery(1, status="completed", created_at=6)
    assert await kept.add(later, 0.0, settle=True, unknown_only=True) is Added.KNOWN
    assert await kept.add(delivery(1), 0.0, settle=True, unknown_only=True) is Added.KNOWN
    assert await kept.claim(10, 10.0) == ()  # still that attempt's alone
    retry = delivery(1, status="completed", created_at=5, attempts=1)
    assert await kept.add(retry, 0.0, settle=True) is Added.KEPT  # its own retry replaces it
    assert await kept.claim(10, 10.0) == (retry,)
    assert await kept.drop("resp_1")
    assert await kept.add(later, 0.0, settle=True, unknown_only=True) is Added.GONE


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
    added = [await kept.add(delivery(n), 10.0) for n in range(4)]
    assert added == [Added.KEPT, Added.KEPT, Added.KEPT, Added.FULL]
    assert await kept.add(delivery(2, attempts=1), 10.0)  # a kept one may still be settled
    assert await kept.drop("resp_0")
    assert await kept.add(delivery(3), 10.0) is Added.KEPT
    assert await kept.add(delivery(0), 10.0, settle=True) is Added.GONE


async def test_a_tenant_keeps_at_most_its_share(nursery: trio.Nursery, store_spec: str) -> None:
    kept = (await store(nursery, store_spec)).deliveries
    added = [await kept.add(of("a", n), 10.0, share=2) for n in range(3)]
    assert added == [Added.KEPT, Added.KEPT, Added.TENANT_FULL]
    assert await kept.add(of("b", 0), 10.0, share=2) is Added.KEPT  # another's share
    for attempts in (1, 2):  # a kept one is settled, and replacing it counts it once
        assert await kept.add(of("a", 1, attempts=attempts), 0.0, share=2, settle=True)
    assert await kept.claim(10, 10.0) != ()  # claimed ones still count
    assert await kept.add(of("a", 2), 10.0, share=2) is Added.TENANT_FULL
    assert await kept.add(of("a", 2), 10.0) is Added.KEPT  # no share given: the store's cap
    assert await kept.drop("resp_a0")
    assert await kept.drop("resp_a2")
    assert await kept.add(of("a", 3), 10.0, share=2) is Added.KEPT


async def test_a_claim_takes_at_most_each_tenants_room_earliest_tenant_first(
    nursery: trio.Nursery, store_spec: str
) -> None:
    """A tenant whose room is spent is passed over, however many of its are due first."""
    kept = (await store(nursery, store_spec)).deliveries
    for n in range(6):
        await kept.add(of("a", n), -1.0 + n / 100)
    await kept.add(of("b", 0), -0.5)
    await kept.add(of("c", 0), -0.6)
    first = await kept.claim(4, 10.0, each=2)
    assert [d.response_id for d in first] == ["resp_a0", "resp_a1", "resp_c0", "resp_b0"]
    await kept.add(of("b", 1), -1.0)
    assert await kept.claim(10, 10.0, each=2, rooms={"a": 0}) == (of("b", 1),)
    assert await kept.claim(10, 10.0, each=2, rooms={"a": 1}) == (of("a", 2),)
    rest = await kept.claim(10, 10.0)  # no bound: every due one
    assert [d.response_id for d in rest] == ["resp_a3", "resp_a4", "resp_a5"]


async def test_an_earlier_sqlite_table_gains_its_tenants(
    nursery: trio.Nursery, tmp_path: Path
) -> None:
    """A table without the tenant column (an earlier release's) is read at the next open:
    each kept delivery counts for its tenant, and a claim passes over a spent tenant."""
    spec = f"sqlite:{tmp_path / 'store.sqlite3'}"
    async with trio.open_nursery() as first:
        await store(first, spec)
        first.cancel_scope.cancel()
    with sqlite3.connect(tmp_path / "store.sqlite3") as db:
        db.executescript(
            "DROP TABLE webhook_deliveries; CREATE TABLE webhook_deliveries (response_id TEXT "
            "PRIMARY KEY, due REAL NOT NULL, body TEXT NOT NULL); CREATE INDEX "
            "webhook_deliveries_due ON webhook_deliveries (due);"
        )
        rows = [(d.response_id, 0.0, encode_delivery(d)) for d in (of("a", 0), of("b", 0))]
        db.executemany("INSERT INTO webhook_deliveries VALUES (?, ?, ?)", rows)
    db.close()
    kept = (await store(nursery, spec)).deliveries
    assert await kept.add(of("a", 1), 10.0, share=1) is Added.TENANT_FULL
    assert await kept.claim(10, 10.0, each=1, rooms={"a": 0}) == (of("b", 0),)
    assert await kept.claim(10, 10.0, each=1) == (of("a", 0),)


async def test_an_earlier_redis_layout_is_moved_to_its_tenants(
    nursery: trio.Nursery, redis_server: RedisServer
) -> None:
    """One sorted set of due times (an earlier release's) is moved to each tenant's at
    the next start, and dropped."""
    prefix = key_prefix()
    base = "{" + prefix + "}:"
    for d, due in ((of("a", 0), "0"), (of("b", 0), "1")):
        redis_server.call("HSET", base + "webhooks:body", d.response_id, encode_delivery(d))
        redis_server.call("ZADD", base + "webhooks:due", due, d.response_id)
    redis_server.call("ZADD", base + "webhooks:due", "2", "resp_gone")  # no body: left out
    kept = (await store(nursery, redis_server.url, prefix)).deliveries
    assert redis_server.call("EXISTS", base + "webhooks:due") == 0
    assert await kept.add(of("a", 1), 10.0, share=1) is Added.TENANT_FULL
    assert await kept.claim(10, 10.0, each=1, rooms={"a": 0}) == (of("b", 0),)
    assert await kept.claim(10, 10.0, each=1) == (of("a", 0),)
