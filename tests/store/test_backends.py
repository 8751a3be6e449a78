"""The memory, SQLite and Redis backends, driven side by side on one clock, answer every
operation the same, and each keeps its counters, caps and byte budgets.

Limits are small, so entry caps, byte budgets, TTL expiry and LRU eviction all happen
within a few steps. A new conversation's `created_at` is the wall clock's; here the time
source of `store_backend` reads the machine's clock, so every backend stamps the same.
Redis runs on the session's redis-server, under a key prefix of each run's own; the
machine holds no replica lease, so Redis reaps every other owner's jobs, as the others do.
"""

from __future__ import annotations

import shutil
import sqlite3
import tempfile
from collections.abc import Awaitable, Callable
from pathlib import Path
from types import SimpleNamespace
from typing import TypeVar
from unittest import mock

import trio
from hypothesis import HealthCheck, event, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
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
from store_invariants import BackendsInvariants
from support import key_prefix

T = TypeVar("T")


class BackendsMachine(BackendsInvariants):
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
            store=running.store,
            status="in_progress",
        )
        updated = self.both(lambda b: b.update_job(progressed, owner))
        assert updated == (self.holders.get(key) == owner)

    @rule(pick=st.integers(0, 2 * len(KEYS)), writer=job_writers, pad=st.sampled_from(PADS))
    def finish_job(self, pick: int, writer: JobOwner, pad: int) -> None:
        key = self.job_key(pick)
        owner = self.writer(key, writer)
        running = self.both(lambda b: b.get((Table.ACTIVE,), key))
        store = running.store if isinstance(running, ResponseRecord) else True
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
