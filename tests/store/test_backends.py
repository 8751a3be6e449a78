"""The memory, SQLite and Redis backends, driven side by side on one clock, answer every
operation the same, and each keeps its counters, caps and byte budgets.

Limits are small, so entry caps, byte budgets, TTL expiry and LRU eviction all happen
within a few steps. A new conversation's `created_at` is the wall clock's; here the time
source of `store_backend` reads the machine's clock, so every backend stamps the same.
Redis runs on the session's redis-server, under a key prefix of each run's own; the
machine holds no replica lease, so Redis reaps every other owner's jobs, as the others do.
"""

from __future__ import annotations

import json
import shutil
import sqlite3
import tempfile
from collections.abc import Awaitable, Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any, TypeVar
from unittest import mock

import trio
from cachetools import Cache
from hypothesis import HealthCheck, event, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    rule,
    run_state_machine_as_test,
)

from mlxcel.items import (
    Conversation,
    Item,
    ResponseRecord,
)
from mlxcel.store import backend as store_backend
from mlxcel.store.backend import JobOwner, StoreBackend
from mlxcel.store.codec import encoded_size
from mlxcel.store.limits import StoreLimits
from mlxcel.store.memory import MemoryBackend
from mlxcel.store.redis import RedisBackend
from mlxcel.store.sqlite import SqliteBackend
from mlxcel.store.tables import ConversationChange, Table

from redis_server import RedisConnection, RedisServer
from store_draws import (
    BOUNDED,
    CONVERSATION_IDS,
    CURRENT,
    HOLDER,
    KEYS,
    PADS,
    START,
    TENANTS,
    changes,
    job_writers,
    limits,
    owners,
    response,
    responses,
    said,
    table_tuples,
)
from support import key_prefix

T = TypeVar("T")


class BackendsMachine(RuleBasedStateMachine):
    """Every rule runs on every backend and asserts the answers are equal."""

    redis_server: RedisServer
    nursery: trio.Nursery
    """Where each run's Redis backend lives (set by the test): the coredis client leaves
    a task group it entered when it opened, so one task opens and closes it."""

    def __init__(self) -> None:
        super().__init__()
        self.now = START
        self.directory = Path(tempfile.mkdtemp())
        self.path = self.directory / "store.sqlite3"
        self.backends: tuple[MemoryBackend, SqliteBackend, RedisBackend] | None = None
        self.reader: sqlite3.Connection | None = None
        self.prefix = key_prefix()
        self.raw: RedisConnection | None = None
        """A connection of the machine's own to Redis, for the invariants."""
        self.closing = trio.Event()
        self.closed = trio.Event()
        self.holders: dict[str, JobOwner] = {}
        """Who holds each unfinished job, as both backends say."""
        self.counted: dict[tuple[str, int], tuple[float, int]] = {}
        """Each rate-limit counter's window start and count, as the backends should have them."""
        self.frozen = mock.patch.object(store_backend, "time", SimpleNamespace(time=self.clock))
        self.frozen.start()

    def clock(self) -> float:
        return self.now

    def both(self, operation: Callable[[StoreBackend], Awaitable[T]]) -> T:
        """The operation's answer, the same from every backend."""
        assert self.backends is not None
        memory, sqlite, redis = self.backends
        in_memory = trio.from_thread.run(operation, memory)
        in_sqlite = trio.from_thread.run(operation, sqlite)
        in_redis = trio.from_thread.run(operation, redis)
        assert in_memory == in_sqlite
        assert in_memory == in_redis
        return in_memory

    async def host_redis(self, task_status: trio.TaskStatus[RedisBackend]) -> None:
        """Open the Redis backend, hand it out, and close it once the run ends."""
        limits = self.limits
        redis = await RedisBackend.open(
            self.redis_server.url,
            self.prefix,
            limits[Table.RESPONSES],
            limits[Table.CONVERSATIONS],
            limits[Table.EPHEMERAL],
            clock=self.clock,
        )
        try:
            task_status.started(redis)
            await self.closing.wait()
        finally:
            await redis.aclose()
            self.closed.set()

    def redis_call(self, *args: str) -> Any:
        assert self.raw is not None
        self.raw.send(*args)
        return self.raw.reply()

    @initialize(
        response_limits=limits(range(1, 6), [1.5, 2, 3, 4], [0, 3, 5]),
        conversation_limits=limits(range(1, 4), [1, 2, 4], [0, 4, 7]),
        ephemeral_limits=limits(range(0, 3), [1, 3], [2, 3]),
    )
    def open(
        self,
        response_limits: StoreLimits,
        conversation_limits: StoreLimits,
        ephemeral_limits: StoreLimits,
    ) -> None:
        self.limits = {
            Table.RESPONSES: response_limits,
            Table.CONVERSATIONS: conversation_limits,
            Table.EPHEMERAL: ephemeral_limits,
        }
        memory = MemoryBackend(
            response_limits, conversation_limits, ephemeral_limits, clock=self.clock, unix_offset=0
        )
        sqlite = trio.from_thread.run(
            lambda: SqliteBackend.open(
                self.path, response_limits, conversation_limits, ephemeral_limits, clock=self.clock
            )
        )
        redis = trio.from_thread.run(lambda: self.nursery.start(self.host_redis))
        self.backends = (memory, sqlite, redis)
        self.raw = self.redis_server.connect()
        self.reader = sqlite3.connect(
            f"file:{self.path}?mode=ro", uri=True, isolation_level=None, check_same_thread=False
        )

    def teardown(self) -> None:
        try:
            if self.backends is not None:
                for backend in self.backends[:2]:
                    trio.from_thread.run(backend.aclose)
                trio.from_thread.run_sync(self.closing.set)
                trio.from_thread.run(self.closed.wait)
            if self.reader is not None:
                self.reader.close()
            if self.raw is not None:
                self.redis_call("EVAL", DELETE_PREFIX, "0", "{" + self.prefix + "}:*")
                self.raw.close()
        finally:
            self.frozen.stop()
            shutil.rmtree(self.directory, ignore_errors=True)

    # --- the store's operations ------------------------------------------------------

    @rule(record=responses(), table=st.sampled_from([Table.RESPONSES, Table.EPHEMERAL]))
    def put(self, record: ResponseRecord, table: Table) -> None:
        kept = self.both(lambda b: b.put(table, record))
        event(f"put {table.value}: kept={kept}")
        assert kept == (
            self.limits[table].enabled and encoded_size(record) <= self.limits[table].max_bytes
        )

    @rule(
        conversation_id=st.sampled_from(CONVERSATION_IDS),
        items=st.lists(said, max_size=3).map(tuple),
    )
    def put_conversation(self, conversation_id: str, items: tuple[Item, ...]) -> None:
        conversation = Conversation(conversation_id, int(self.now), items=items)
        self.both(lambda b: b.put(Table.CONVERSATIONS, conversation))

    @rule(tables=table_tuples, key=st.sampled_from(KEYS + CONVERSATION_IDS))
    def get(self, tables: tuple[Table, ...], key: str) -> None:
        self.both(lambda b: b.get(tables, key))

    @rule(key=st.sampled_from(KEYS))
    def get_chain(self, key: str) -> None:
        chain = self.both(lambda b: b.get_chain(key))
        event(f"chain: {min(len(chain.records), 3)} records, missing={chain.missing is not None}")
        for newer, older in zip(chain.records, chain.records[1:], strict=False):
            assert newer.echo.previous_response_id == older.id
        if chain.records and chain.missing is None:
            assert chain.records[-1].echo.previous_response_id is None

    @rule(
        ids=st.frozensets(st.sampled_from(["msg_a", "msg_b", "fc_c", "msg_none"]), min_size=1),
        tenant=st.sampled_from(TENANTS),
    )
    def find_items(self, ids: frozenset[str], tenant: str) -> None:
        found = self.both(lambda b: b.find_items(ids, tenant))
        assert set(found) <= ids
        assert all(item.id == item_id for item_id, item in found.items())
        event(f"items found: {len(found)}")

    @rule(
        table=st.sampled_from(list(Table)),
        key=st.sampled_from(KEYS + CONVERSATION_IDS),
    )
    def delete(self, table: Table, key: str) -> None:
        deleted = self.both(lambda b: b.delete(table, key))
        if table is Table.ACTIVE:
            assert deleted == (self.holders.pop(key, None) is not None)
        event(f"deleted: {deleted}")

    @rule(conversation_id=st.sampled_from(CONVERSATION_IDS), change=changes, create=st.booleans())
    def change_conversation(
        self, conversation_id: str, change: ConversationChange, create: bool
    ) -> None:
        changed = self.both(lambda b: b.change_conversation(conversation_id, change, create))
        event(
            f"conversation change: {changed if not isinstance(changed, Conversation) else 'made'}"
        )

    @rule()
    def statistics(self) -> None:
        statistics = self.both(lambda b: b.statistics())
        # Expired entries are gone now, so the file holds exactly what is counted.
        assert self.reader is not None
        rows = self.reader.execute(
            "SELECT tbl, count(*), sum(size) FROM entries GROUP BY tbl"
        ).fetchall()
        in_file = {Table(tbl): (entries, size) for tbl, entries, size in rows}
        for table in Table:
            counted = getattr(statistics, table.value)
            assert (counted.entries, counted.bytes) == in_file.get(table, (0, 0))

    @rule(
        counter=st.sampled_from(["requests:a", "requests:b", "tokens:a"]),
        amount=st.sampled_from([0, 1, 1, 7]),
        limit=st.sampled_from([0, 1, 3, 10]),
        window_secs=st.sampled_from([1, 4, 60]),
    )
    def charge(self, counter: str, amount: int, limit: int, window_secs: int) -> None:
        charged = self.both(lambda b: b.charge(counter, amount, limit, window_secs))
        start = (self.now // window_secs) * window_secs
        held_start, used = self.counted.get((counter, window_secs), (start, 0))
        used = used if held_start == start else 0
        assert charged.allowed == (limit == 0 or used < limit)
        if charged.allowed:
            used += amount
            self.counted[(counter, window_secs)] = (start, used)
        assert charged.used == used
        assert charged.resets_in == start + window_secs - self.now
        assert 0 < charged.resets_in <= window_secs
        event(f"charge: allowed={charged.allowed}, amount={amount}")

    @rule(seconds=st.sampled_from([0.5, 1.0, 2.0, 3.0, 5.0]))
    def advance_clock(self, seconds: float) -> None:
        self.now += seconds

    # --- background jobs -------------------------------------------------------------

    @rule(key=st.sampled_from(KEYS), owner=owners, store=st.booleans(), data=st.data())
    def register_job(self, key: str, owner: JobOwner, store: bool, data: st.DataObject) -> None:
        record = data.draw(responses(key))
        queued = response(key, 0, record.echo.previous_response_id, store=store, status="queued")
        self.both(lambda b: b.register_job(queued, owner))
        self.holders[key] = owner

    @rule(pick=st.integers(0, 2 * len(KEYS)), writer=job_writers, pad=st.sampled_from(PADS))
    def update_job(self, pick: int, writer: JobOwner, pad: int) -> None:
        key = self.job_key(pick)
        owner = self.writer(key, writer)
        running = self.both(lambda b: b.get((Table.ACTIVE,), key))
        if not isinstance(running, ResponseRecord):
            running = response(key, 0, status="queued")
        progressed = response(
            key,
            pad,
            running.echo.previous_response_id,
            ("msg_b",),
            store=running.echo.store,
            status="in_progress",
        )
        updated = self.both(lambda b: b.update_job(progressed, owner))
        assert updated == (self.holders.get(key) == owner)

    @rule(pick=st.integers(0, 2 * len(KEYS)), writer=job_writers, pad=st.sampled_from(PADS))
    def finish_job(self, pick: int, writer: JobOwner, pad: int) -> None:
        key = self.job_key(pick)
        owner = self.writer(key, writer)
        running = self.both(lambda b: b.get((Table.ACTIVE,), key))
        store = running.echo.store if isinstance(running, ResponseRecord) else True
        prev = running.echo.previous_response_id if isinstance(running, ResponseRecord) else None
        final = response(key, pad, prev, ("msg_a", "fc_c"), store=store)
        stored = self.both(lambda b: b.finish_job(final, owner))
        event(f"finish: {'fenced' if stored is None else stored.status}")
        assert (stored is not None) == (self.holders.get(key) == owner)
        if stored is not None:
            del self.holders[key]
            assert stored.id == key
            assert stored == final or stored.status == "failed"

    @rule(pick=st.integers(0, 2 * len(KEYS)))
    def request_cancel(self, pick: int) -> None:
        key = self.job_key(pick)
        assert self.both(lambda b: b.request_cancel(key)) == self.holders.get(key)

    @rule(owner=owners)
    def reap(self, owner: JobOwner) -> None:
        reaped = self.both(lambda b: b.reap(owner))
        assert reaped == sum(holder != owner for holder in self.holders.values())
        self.holders = {k: h for k, h in self.holders.items() if h == owner}
        event(f"reaped: {min(reaped, 2)}")
        # Idempotent: what one reap ended is no longer unfinished.
        assert self.both(lambda b: b.reap(owner)) == 0

    def job_key(self, pick: int) -> str:
        """Mostly an unfinished job's id (when there is one), else any id."""
        if pick < len(KEYS) or not self.holders:
            return KEYS[pick % len(KEYS)]
        return sorted(self.holders)[pick % len(self.holders)]

    def writer(self, key: str, writer: JobOwner) -> JobOwner:
        return self.holders.get(key, CURRENT) if writer is HOLDER else writer

    # --- invariants (read without touching: no expiry, no LRU order changes) ---------

    @invariant()
    def memory_tables_are_within_their_limits(self) -> None:
        assert self.backends is not None
        memory = self.backends[0]
        for table in BOUNDED:
            cache = memory._tables[table]._cache
            keys = list(Cache.__iter__(cache))
            size = Cache.currsize.fget(cache)  # type: ignore[attr-defined]
            assert size == sum(encoded_size(Cache.__getitem__(cache, k)) for k in keys)
            assert len(keys) <= self.limits[table].max_entries
            assert size <= self.limits[table].max_bytes
        index = memory._tables[Table.RESPONSES].index
        assert index is not None
        assert set(index._keys) == set(Cache.__iter__(memory._tables[Table.RESPONSES]._cache))
        for pinned in memory._active.values():
            assert pinned.size == encoded_size(pinned.record)

    @invariant()
    def the_file_is_within_its_limits_and_its_counters(self) -> None:
        assert self.reader is not None
        assert self.backends is not None
        sqlite = self.backends[1]
        rows = self.reader.execute(
            "SELECT tbl, count(*), sum(size), sum(size != length(body)) FROM entries GROUP BY tbl"
        ).fetchall()
        in_file = {Table(tbl): (entries, size) for tbl, entries, size, _ in rows}
        assert all(wrong == 0 for *_, wrong in rows)
        for table in Table:
            assert list(in_file.get(table, (0, 0))) == sqlite._rows.counts[table]
        for table in BOUNDED:
            entries, size = in_file.get(table, (0, 0))
            assert entries <= self.limits[table].max_entries
            assert size <= self.limits[table].max_bytes
        (strays,) = self.reader.execute(
            "SELECT count(*) FROM items WHERE response_id NOT IN "
            "(SELECT id FROM entries WHERE tbl = 'responses')"
        ).fetchone()
        assert strays == 0

    @invariant()
    def both_hold_the_same_entries_in_the_same_eviction_order(self) -> None:
        """Expired entries not yet dropped included: each backend drops them at the same
        operations, and evicts in the same least-recently-used order."""
        assert self.reader is not None
        assert self.backends is not None
        memory = self.backends[0]
        for table in BOUNDED:
            cache = memory._tables[table]._cache
            in_memory = list(cache._TTLCache__links)  # type: ignore[attr-defined]
            in_file = [
                key
                for (key,) in self.reader.execute(
                    "SELECT id FROM entries WHERE tbl = ? ORDER BY last_access", (table.value,)
                )
            ]
            assert in_memory == in_file, table
        # Unfinished jobs: the same, in the order a reap ends them.
        in_file_active = [
            key
            for (key,) in self.reader.execute(
                "SELECT id FROM entries WHERE tbl = 'active' ORDER BY last_access"
            )
        ]
        assert list(memory._active) == in_file_active

    @invariant()
    def redis_keeps_its_counters_indexes_and_eviction_order(self) -> None:
        """Read raw in one script (nothing expires, no LRU order changes)."""
        assert self.backends is not None
        memory, sqlite = self.backends[0], self.backends[1]
        raw = self.redis_call("EVAL", SNAPSHOT, "0", "{" + self.prefix + "}:")
        snapshot = json.loads(raw)
        for table in Table:
            keys = {part: _listed(v) for part, v in snapshot[table.value].items()}
            ids = sorted(keys["ids"])
            stored = int(snapshot[table.value]["bytes"])
            assert stored == sum(keys["lengths"]), table
            assert [len(ids), stored] == sqlite._rows.counts[table], table
            order = keys["lru"]
            assert sorted(order) == ids, table
            assert sorted(keys["ver"]) == ids, table
            assert set(keys["link"]) <= set(ids), table
            ttl = self.limits[table].ttl_secs if table in BOUNDED else 0
            assert set(keys["exp"]) == (set(ids) if ttl > 0 else set()), table
            if table in BOUNDED:
                cache = memory._tables[table]._cache
                assert order == list(cache._TTLCache__links), table  # type: ignore[attr-defined]
            else:
                assert order == list(memory._active), table
        owners = _listed(snapshot["owners"])
        held = {owners[n]: JobOwner(*owners[n + 1].split("\n")) for n in range(0, len(owners), 2)}
        assert held == self.holders
        assert set(_listed(snapshot["cancels"])) <= set(self.holders)
        # The item index: each stored response's (tenant, id) keys once, each key's
        # sorted set holding exactly the responses that list it, at the listed place.
        responses = set(_listed(snapshot["responses"]["ids"]))
        indexed = _listed(snapshot["itemkeys"])
        by_response = {
            indexed[n]: {(key, place) for key, place in json.loads(indexed[n + 1])}
            for n in range(0, len(indexed), 2)
        }
        assert set(by_response) <= responses
        for places in by_response.values():
            assert len({key for key, _ in places}) == len(places)  # each key once
        listed = {(rid, key, place) for rid, places in by_response.items() for key, place in places}
        held = set()
        sets = _listed(snapshot["ix"])
        for n in range(0, len(sets), 2):
            key = sets[n].removeprefix("{" + self.prefix + "}:ix:")
            members = _listed(sets[n + 1])
            assert members
            for member in members:
                rid, _, place = member.rpartition("\n")
                held.add((rid, key, place))
        assert held == listed


def _listed(value: Any) -> list[Any]:
    """A Lua table cjson encoded: an empty one comes as `{}`."""
    return value if isinstance(value, list) else []


SNAPSHOT = """
local B = ARGV[1]
local out = {}
for _, t in ipairs({'responses', 'conversations', 'ephemeral', 'active'}) do
  local body = B .. t .. ':body'
  local ids = redis.call('HKEYS', body)
  local lengths = {}
  for i, id in ipairs(ids) do lengths[i] = redis.call('HSTRLEN', body, id) end
  out[t] = {
    ids = ids, lengths = lengths, bytes = redis.call('GET', B .. t .. ':bytes') or '0',
    lru = redis.call('ZRANGE', B .. t .. ':lru', 0, -1),
    exp = redis.call('ZRANGE', B .. t .. ':exp', 0, -1),
    ver = redis.call('HKEYS', B .. t .. ':ver'), link = redis.call('HKEYS', B .. t .. ':link'),
  }
end
out.owners = redis.call('HGETALL', B .. 'active:owner')
out.cancels = redis.call('SMEMBERS', B .. 'active:cancel')
out.itemkeys = redis.call('HGETALL', B .. 'responses:itemkeys')
out.ix = {}
for _, key in ipairs(redis.call('KEYS', B .. 'ix:*')) do
  out.ix[#out.ix + 1] = key
  out.ix[#out.ix + 1] = redis.call('ZRANGE', key, 0, -1)
end
return cjson.encode(out)
"""
"""Every key of a run's Redis store, read in one step, as JSON."""


DELETE_PREFIX = """
for _, key in ipairs(redis.call('KEYS', ARGV[1])) do redis.call('DEL', key) end
return 1
"""
"""Removes a finished run's keys (its prefix is its own)."""


def _run(machine: type[RuleBasedStateMachine], examples: int, steps: int) -> None:
    run_state_machine_as_test(
        machine,
        settings=settings(
            max_examples=examples,
            stateful_step_count=steps,
            deadline=None,
            suppress_health_check=[HealthCheck.too_slow],
        ),
    )


def test_the_backends_agree_step_by_step(redis_server: RedisServer) -> None:
    """The machine runs on a worker thread of one Trio run; each call hops onto Trio."""

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            BackendsMachine.redis_server = redis_server
            BackendsMachine.nursery = nursery
            await trio.to_thread.run_sync(lambda: _run(BackendsMachine, EXAMPLES, 50))

    trio.run(main)


EXAMPLES = 200
