"""The limiter on the store's counters: defaults and a key's own limits, windows that end,
tokens charged after the fact, and a request limit that holds under concurrency on
every backend (on Redis, with two clients as two replicas would have)."""

from __future__ import annotations

import contextlib
import sqlite3
from collections.abc import AsyncIterator
from pathlib import Path

import trio

from mlxcel.keys import KeyLimits
from mlxcel.quotas import DAY_SECS, MINUTE_SECS, AdminBuckets, Limiter
from mlxcel.store import StoreLimits
from mlxcel.store.backend import Charge, StoreBackend
from mlxcel.store.memory import MemoryBackend
from mlxcel.store.redis import RedisBackend
from mlxcel.store.sqlite import SqliteBackend
from mlxcel.store.sqlite.file import SCHEMA_VERSION

from redis_server import RedisServer
from support import key_prefix

LIMITS = StoreLimits(10, 1 << 20, 0)
NOON = 1_000_000 * DAY_SECS + DAY_SECS / 2
"""A fixed time for the durable backends, far from a window's end."""


def memory() -> MemoryBackend:
    """On the fake clock, whose 0 is taken for midnight UTC."""
    return MemoryBackend(LIMITS, LIMITS, LIMITS, unix_offset=0)


def noon() -> float:
    return NOON


async def test_a_key_is_held_to_its_request_limit_until_the_minute_ends(
    autojump_clock: trio.testing.MockClock,
) -> None:
    store = memory()
    limiter = Limiter(store.charge, KeyLimits(rpm=2, tpm=0, daily=0))
    first, second, third = [await limiter.admit("a") for _ in range(3)]
    assert (first.refused, second.refused, third.refused) == (None, None, "requests")
    assert third.requests is not None
    assert (third.requests.used, third.requests.remaining) == (2, 0)
    assert (await limiter.admit("b")).refused is None  # each key counts alone
    await trio.sleep(third.requests.resets_in)
    again = await limiter.admit("a")
    assert again.refused is None
    assert again.requests is not None
    assert again.requests.remaining == 1


async def test_tokens_are_charged_when_spent_and_refuse_once_the_limit_is_reached(
    autojump_clock: trio.testing.MockClock,
) -> None:
    store = memory()
    limiter = Limiter(store.charge, KeyLimits(rpm=0, tpm=100, daily=250))
    admitted = await limiter.admit("a")
    assert admitted.refused is None
    assert admitted.tokens is not None
    assert admitted.tokens.remaining == 100
    spend, _ = await limiter.reserve(admitted, 0)
    assert spend is not None
    await spend(120)  # one request may overshoot ...
    refused = await limiter.admit("a")  # ... and the next is refused
    assert refused.refused == "tokens"
    assert refused.daily is not None
    assert refused.daily.remaining == 130
    await trio.sleep(MINUTE_SECS)
    spend, _ = await limiter.reserve(await limiter.admit("a"), 0)
    assert spend is not None
    await spend(130)
    await trio.sleep(MINUTE_SECS)
    spent = await limiter.admit("a")
    assert spent.refused == "daily"  # a new minute, but the day's tokens are gone
    assert spent.daily is not None
    assert spent.daily.resets_in == DAY_SECS - trio.current_time()


async def test_reservations_let_a_key_spend_its_limit_plus_one_request_and_settle(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """Tokens read at admission and charged at the end let a burst walk past the limit
    (30 concurrent requests of a `daily=1000` key spent 90,780). Reserved before they run,
    the third of three 600-token requests is refused, and what the first did not spend
    comes back when it ends."""
    store = memory()
    limiter = Limiter(store.charge, KeyLimits(rpm=0, tpm=0, daily=1000))
    admitted = [await limiter.admit("a") for _ in range(3)]
    first, _ = await limiter.reserve(admitted[0], 600)
    second, _ = await limiter.reserve(admitted[1], 600)
    third, refused = await limiter.reserve(admitted[2], 600)
    assert first is not None
    assert second is not None
    assert third is None
    assert refused.refused == "daily"
    assert refused.daily is not None
    assert refused.daily.used == 1200
    await first(100)  # 500 of its 600 come back
    assert (await store.charge("daily:a", 0, 0, DAY_SECS)).used == 700
    await second(650)  # 50 more than it reserved
    assert (await store.charge("daily:a", 0, 0, DAY_SECS)).used == 750


async def test_a_reservation_outliving_its_window_returns_nothing_to_the_next(
    autojump_clock: trio.testing.MockClock,
) -> None:
    store = memory()
    limiter = Limiter(store.charge, KeyLimits(rpm=0, tpm=1000, daily=0))
    spend, _ = await limiter.reserve(await limiter.admit("a"), 800)
    assert spend is not None
    await trio.sleep(MINUTE_SECS)  # its minute is over: the next one starts from 0
    other, _ = await limiter.reserve(await limiter.admit("a"), 300)
    assert other is not None
    await spend(10)  # nothing comes off the new minute's 300
    assert (await store.charge("tokens:a", 0, 0, MINUTE_SECS)).used == 300
    await other(0, final=False)
    await other(300)
    assert (await store.charge("tokens:a", 0, 0, MINUTE_SECS)).used == 300


async def test_a_keys_own_limits_override_the_defaults_one_by_one(
    autojump_clock: trio.testing.MockClock,
) -> None:
    own = {"vip": KeyLimits(rpm=3), "free": KeyLimits(rpm=0, tpm=5)}
    limiter = Limiter(memory().charge, KeyLimits(rpm=1, tpm=50, daily=0), own.get)
    assert limiter.limits_of("vip") == KeyLimits(3, 50, 0)
    assert limiter.limits_of("free") == KeyLimits(0, 5, 0)
    assert limiter.limits_of("anyone") == KeyLimits(1, 50, 0)
    assert [(await limiter.admit("vip")).refused for _ in range(4)] == [None] * 3 + ["requests"]
    assert [(await limiter.admit("free")).refused for _ in range(4)] == [None] * 4


async def test_all_limits_off_counts_nothing() -> None:
    calls: list[str] = []

    async def charge(counter: str, amount: int, limit: int, window: int) -> Charge:
        calls.append(counter)
        return Charge(True, 0, 1.0)

    limiter = Limiter(charge, KeyLimits(0, 0, 0))
    admission = await limiter.admit("a")
    assert admission.refused is None
    spend, admission = await limiter.reserve(admission, 10)
    assert spend is None
    assert admission.refused is None
    assert calls == []


@contextlib.asynccontextmanager
async def open_backends(
    kind: str, tmp_path: Path, redis: RedisServer
) -> AsyncIterator[tuple[StoreBackend, StoreBackend]]:
    """Two handles on one store: on Redis, two clients, as two replicas have."""
    if kind == "sqlite":
        sqlite = await SqliteBackend.open(
            tmp_path / "store.sqlite3", LIMITS, LIMITS, LIMITS, clock=noon
        )
        try:
            yield sqlite, sqlite
        finally:
            await sqlite.aclose()
        return
    prefix = key_prefix()
    one = await RedisBackend.open(redis.url, prefix, LIMITS, LIMITS, LIMITS, clock=noon)
    try:
        two = await RedisBackend.open(redis.url, prefix, LIMITS, LIMITS, LIMITS, clock=noon)
        try:
            yield one, two
        finally:
            await two.aclose()
    finally:
        await one.aclose()


async def test_concurrent_requests_never_pass_the_limit(
    tmp_path: Path, redis_server: RedisServer
) -> None:
    for kind in ("sqlite", "redis"):
        async with open_backends(kind, tmp_path, redis_server) as backends:
            answers: list[bool] = []

            async def ask(backend: StoreBackend, answers: list[bool] = answers) -> None:
                charged = await backend.charge("requests:a", 1, 7, DAY_SECS)
                answers.append(charged.allowed)

            async with trio.open_nursery() as nursery:
                for n in range(30):
                    nursery.start_soon(ask, backends[n % 2])
            assert answers.count(True) == 7, kind
            final = await backends[0].charge("requests:a", 0, 7, DAY_SECS)
            assert (final.allowed, final.used) == (False, 7)


async def test_a_file_of_the_first_layout_opens_and_gains_the_counters(tmp_path: Path) -> None:
    path = tmp_path / "store.sqlite3"
    store = await SqliteBackend.open(path, LIMITS, LIMITS, LIMITS, clock=noon)
    assert (await store.charge("tokens:a", 5, 0, DAY_SECS)).used == 5
    await store.aclose()
    with contextlib.closing(sqlite3.connect(path)) as db:  # as the release before left it
        db.execute("DROP TABLE counters")
        db.execute("PRAGMA user_version = 1")
        db.commit()
    store = await SqliteBackend.open(path, LIMITS, LIMITS, LIMITS, clock=noon)
    assert (await store.charge("tokens:a", 5, 0, DAY_SECS)).used == 5
    await store.aclose()
    store = await SqliteBackend.open(
        path, LIMITS, LIMITS, LIMITS, clock=noon
    )  # counters outlive a restart
    assert (await store.charge("tokens:a", 1, 0, DAY_SECS)).used == 6
    await store.aclose()
    with contextlib.closing(sqlite3.connect(path)) as db:
        assert db.execute("PRAGMA user_version").fetchone() == (SCHEMA_VERSION,)


def test_an_admins_bucket_holds_a_burst_and_refills_at_its_rate() -> None:
    now = [0.0]
    buckets = AdminBuckets(3, clock=lambda: now[0])
    assert [buckets.take("ops") for _ in range(3)] == [0.0, 0.0, 0.0]
    assert buckets.take("ops") == 20.0  # one call back in a third of a minute
    assert buckets.take("root") == 0.0  # each key its own bucket
    now[0] = 10.0
    assert buckets.take("ops") == 10.0  # half refilled; a refusal takes nothing
    now[0] = 20.0
    assert buckets.take("ops") == 0.0
    assert buckets.take("ops") > 0
    now[0] = 10_000.0  # a long pause refills to the burst, never beyond
    assert [buckets.take("ops") for _ in range(3)] == [0.0, 0.0, 0.0]
    assert buckets.take("ops") > 0
    assert all(AdminBuckets(0).take("any") == 0.0 for _ in range(100))  # 0: no limit
