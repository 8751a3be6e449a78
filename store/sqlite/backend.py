"""The SQLite backend: the store in one file that survives restarts (`--store sqlite`).

One connection, driven from one worker thread at a time (a capacity limiter of one), so
Trio never blocks on the disk and each operation is one transaction: nothing another
caller does can land between its read and its write. The file is in WAL mode with
`synchronous=NORMAL`: a committed operation survives the process being killed (an OS
crash or power loss may lose the last ones). An exclusive lock on `<file>.lock` keeps a
second server off the file, which also lets the entry and byte counters live in memory:
they are read once at open and changed only by this process's own transactions.

Time is the wall clock by default, so a TTL means the same after a restart. A read
touches its entry's `last_access` (a counter, not a time), which orders LRU eviction.
"""

from __future__ import annotations

import logging
import os
import sqlite3
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import trio

from mlxcel.errors import StoreUnavailable
from mlxcel.items import Conversation, Item, ResponseRecord
from mlxcel.store.backend import (
    MAX_CHAIN_HOPS,
    Chain,
    Charge,
    JobOwner,
    UnreadableJobs,
    changed_conversation,
    final_table,
    reaped,
    too_large,
)
from mlxcel.store.codec import CodecError, decode, decode_record, encode
from mlxcel.store.item_index import item_at
from mlxcel.store.limits import StoreLimits
from mlxcel.store.sqlite.counters import charge
from mlxcel.store.sqlite.deliveries import SqliteDeliveries
from mlxcel.store.sqlite.file import (
    CHAIN,
    ITEM_PLACES,
    LIVE,
    PAGE_BYTES,
    Checkpointer,
    connect,
    lock_file,
)
from mlxcel.store.sqlite.rows import Rows, Traces
from mlxcel.store.tables import (
    ConversationChange,
    Refused,
    Stored,
    StoreStatistics,
    Table,
    TableStatistics,
)

log = logging.getLogger(__name__)

T = TypeVar("T")


class SqliteBackend:
    """`StoreBackend` in a SQLite file (see `store/backend.py`)."""

    def __init__(
        self,
        db: sqlite3.Connection,
        checkpointer: Checkpointer,
        lock: int,
        limits: dict[Table, StoreLimits],
        clock: Callable[[], float],
        echo_bytes: int = 0,
    ) -> None:
        self._db = db
        self._checkpointer = checkpointer
        self._lock = lock
        self._limits = limits
        self._clock = clock
        self._limiter = trio.CapacityLimiter(1)
        self._closed = False
        self._rows = Rows(db)
        self._traces = Traces(db, echo_bytes)
        self._unreadable = UnreadableJobs()
        self.deliveries = SqliteDeliveries(db, self._call)  # webhooks' (store/deliveries.py)

    @classmethod
    async def open(
        cls,
        path: Path,
        responses: StoreLimits,
        conversations: StoreLimits,
        ephemeral: StoreLimits,
        *,
        echo_bytes: int = 0,
        clock: Callable[[], float] | None = None,
    ) -> SqliteBackend:
        """Lock and open (or create) the file; ConfigError when another server holds it
        or it cannot be read."""
        limits = {
            Table.RESPONSES: responses,
            Table.CONVERSATIONS: conversations,
            Table.EPHEMERAL: ephemeral,
        }

        def opened() -> SqliteBackend:
            lock = lock_file(path)
            try:
                db = connect(path)
                try:
                    checkpointer = Checkpointer(path)
                    clock_or_wall = clock or time.time
                    return cls(db, checkpointer, lock, limits, clock_or_wall, echo_bytes)
                except BaseException:
                    db.close()
                    raise
            except BaseException:
                os.close(lock)
                raise

        return await trio.to_thread.run_sync(opened)

    # --- the protocol ----------------------------------------------------------------

    async def put(self, table: Table, value: Stored) -> bool:
        return await self._call(self._put, table, value)

    async def get(self, tables: tuple[Table, ...], key: str) -> Stored | None:
        return await self._call(self._get, tables, key)

    async def get_chain(self, response_id: str) -> Chain:
        return await self._call(self._get_chain, response_id)

    async def find_items(self, ids: frozenset[str], tenant: str = "") -> dict[str, Item]:
        return await self._call(self._find_items, ids, tenant)

    async def delete(self, table: Table, key: str) -> bool:
        return await self._call(self.remove, table, key)

    async def change_conversation(
        self, conversation_id: str, change: ConversationChange, create: bool
    ) -> Conversation | Refused:
        return await self._call(self._change, conversation_id, change, create)

    async def statistics(self) -> StoreStatistics:
        return await self._call(self._statistics)

    async def register_job(self, record: ResponseRecord, owner: JobOwner) -> None:
        await self._call(self._register_job, record, owner)

    async def update_job(self, record: ResponseRecord, owner: JobOwner) -> bool:
        return await self._call(self._update_job, record, owner)

    async def finish_job(self, final: ResponseRecord, owner: JobOwner) -> ResponseRecord | None:
        return await self._call(self._finish_job, final, owner)

    async def request_cancel(self, response_id: str) -> JobOwner | None:
        return await self._call(self._request_cancel, response_id)

    async def reap(self, owner: JobOwner) -> int:
        return await self._call(self._reap, owner)

    async def remember(self, key: str, reasoning: str) -> None:
        await self._call(self._traces.remember, key, reasoning)

    async def recall(self, keys: tuple[str, ...]) -> dict[str, str]:
        return await self._call(self._traces.recall, keys)

    async def charge(self, counter: str, amount: int, limit: int, window_secs: int) -> Charge:
        return await self._call(self._charge, counter, amount, limit, window_secs)

    async def maintain(self) -> None:
        await self._checkpointer.run_when_due()

    async def aclose(self) -> None:
        def close() -> None:
            if not self._closed:
                self._closed = True
                self._db.close()  # the last connection copies the log in and removes it
                os.close(self._lock)

        with trio.CancelScope(shield=True):
            await self._checkpointer.aclose()
            await trio.to_thread.run_sync(close, limiter=self._limiter)

    # --- one transaction each, on the store's thread ------------------------------------

    async def transact(self, operation: Callable[..., T], *args: Any) -> T:
        """`operation(now, db, *args)` as one transaction on the store's thread (for
        tables kept beside the entries: the event logs)."""
        return await self._call(operation, self._db, *args)

    async def _call(self, operation: Callable[..., T], *args: Any) -> T:
        now = self._clock()  # read here: an injected clock may be Trio's

        def run() -> T:
            if self._closed:
                raise trio.ClosedResourceError("the store is closed")
            try:
                return self._in_transaction(operation, now, *args)
            except (sqlite3.Error, CodecError) as exc:
                log.error("the store file failed: %s", exc)
                raise StoreUnavailable(
                    "The response store could not be read or written; retry later.",
                    code="store_unavailable",
                ) from exc

        try:
            return await trio.to_thread.run_sync(run, limiter=self._limiter)
        finally:
            self._checkpointer.wrote(PAGE_BYTES + self._rows.written)
            self._rows.written = 0

    def _in_transaction(self, operation: Callable[..., T], now: float, *args: Any) -> T:
        self._db.execute("BEGIN IMMEDIATE")
        try:
            result = operation(now, *args)
            self._db.execute("COMMIT")
        except BaseException:
            if self._db.in_transaction:  # SQLite ends some failed ones itself
                self._db.execute("ROLLBACK")
            self._rows.recount()  # the counters follow what was committed
            self._traces.recount()
            raise
        return result

    def _put(self, now: float, table: Table, value: Stored) -> bool:
        limits = self._limits[table]
        if not limits.enabled:
            return False
        body = encode(value)
        if len(body) > limits.max_bytes:
            log.info("%s is larger than its store's byte budget; not kept", value.id)
            return False
        self._rows.purge(table, now)
        self._rows.remove(table, "id = :id", id=value.id)  # replacing a key never double-counts
        while self._rows.counts[table][1] + len(body) > limits.max_bytes:
            self._rows.evict_one(table)
        expires = now + limits.ttl_secs if limits.ttl_secs > 0 else None
        self._rows.insert(table, value, body, expires=expires)
        while self._rows.counts[table][0] > limits.max_entries:
            self._rows.evict_one(table)
        return True

    def _get(self, now: float, tables: tuple[Table, ...], key: str) -> Stored | None:
        for table in tables:
            row = self._db.execute(
                f"SELECT rowid, body FROM entries WHERE tbl = :tbl AND id = :id AND {LIVE}",
                {"tbl": table.value, "id": key, "now": now},
            ).fetchone()
            if row is not None:
                self._rows.touch(table, row[0])
                return decode(row[1])
        return None

    def _get_chain(self, now: float, response_id: str) -> Chain:
        rows = self._db.execute(
            CHAIN,
            {"id": response_id, "now": now, "hops": MAX_CHAIN_HOPS},
        ).fetchall()
        records: list[ResponseRecord] = []
        for key, rowid, tbl, body in rows:
            if rowid is None:
                return Chain(tuple(records), key)
            self._rows.touch(Table(tbl), rowid)
            records.append(decode_record(body))
        return Chain(tuple(records))

    def _find_items(self, now: float, ids: frozenset[str], tenant: str) -> dict[str, Item]:
        found: dict[str, Item] = {}
        records: dict[int, Stored] = {}  # each holding record decoded once per request
        for item_id in sorted(ids):
            where = {"item": item_id, "tenant": tenant, "now": now}
            for rowid, place in self._db.execute(ITEM_PLACES, where).fetchall():
                if rowid not in records:
                    (body,) = self._db.execute(
                        "SELECT body FROM entries WHERE rowid = ?", (rowid,)
                    ).fetchone()
                    records[rowid] = decode(body)
                record = records[rowid]
                item = item_at(record, place) if isinstance(record, ResponseRecord) else None
                if item is not None and item.id == item_id:
                    self._rows.touch(Table.RESPONSES, rowid)
                    found[item_id] = item
                    break
        return found

    def remove(self, now: float, table: Table, key: str) -> bool:
        """`delete` in the caller's transaction (an expired entry is already gone)."""
        return self._rows.remove(table, f"id = :id AND {LIVE}", id=key, now=now) > 0

    def _change(
        self, now: float, conversation_id: str, change: ConversationChange, create: bool
    ) -> Conversation | Refused:
        current = self._get(now, (Table.CONVERSATIONS,), conversation_id)
        if not isinstance(current, Conversation):
            current = None
        updated = changed_conversation(current, conversation_id, change, create)
        if isinstance(updated, Refused) or updated is current:
            return updated
        # A refused put keeps the transcript that was there.
        return updated if self._put(now, Table.CONVERSATIONS, updated) else Refused.FULL

    def _statistics(self, now: float) -> StoreStatistics:
        for table in self._limits:
            self._rows.purge(table, now)

        def of(table: Table) -> TableStatistics:
            entries, size = self._rows.counts[table]
            return TableStatistics(entries=entries, bytes=size)

        return StoreStatistics(
            responses=of(Table.RESPONSES),
            conversations=of(Table.CONVERSATIONS),
            ephemeral=of(Table.EPHEMERAL),
            active=of(Table.ACTIVE),
        )

    def _register_job(self, now: float, record: ResponseRecord, owner: JobOwner) -> None:
        self._rows.remove(Table.ACTIVE, "id = :id", id=record.id)
        self._rows.insert(Table.ACTIVE, record, encode(record), owner=owner)

    def _update_job(self, now: float, record: ResponseRecord, owner: JobOwner) -> bool:
        old = self._rows.held_size(record.id, owner)
        if old is None:
            return False
        body = encode(record)
        self._db.execute(
            "UPDATE entries SET body = :body, size = :size WHERE tbl = 'active' AND id = :id",
            {"body": body, "size": len(body), "id": record.id},
        )
        self._rows.counts[Table.ACTIVE][1] += len(body) - old
        return True

    def _finish_job(
        self, now: float, final: ResponseRecord, owner: JobOwner
    ) -> ResponseRecord | None:
        if self._rows.held_size(final.id, owner) is None:
            return None
        return self._finish(now, final)

    def _request_cancel(self, now: float, response_id: str) -> JobOwner | None:
        row = self._db.execute(
            "UPDATE entries SET cancel_requested = 1 WHERE tbl = 'active' AND id = :id "
            "RETURNING owner, epoch",
            {"id": response_id},
        ).fetchone()
        return JobOwner(row[0], row[1]) if row is not None else None

    def _reap(self, now: float, owner: JobOwner) -> int:
        rows = self._db.execute(
            "SELECT id, body, cancel_requested FROM entries WHERE tbl = 'active' "
            "AND NOT (owner IS :replica AND epoch IS :epoch) ORDER BY last_access",
            {"replica": owner.replica, "epoch": owner.epoch},
        ).fetchall()
        jobs = self._unreadable.readable(rows)
        for _, record, cancel_requested in jobs:
            self._finish(now, reaped(record, bool(cancel_requested)))
        return len(jobs)

    def _charge(
        self, now: float, counter: str, amount: int, limit: int, window_secs: int
    ) -> Charge:
        return charge(self._db, now, counter, amount, limit, window_secs)

    # --- pieces of one transaction ---------------------------------------------------

    def _finish(self, now: float, final: ResponseRecord) -> ResponseRecord:
        table = final_table(final)
        if not self._put(now, table, final):
            final = too_large(final)
            self._put(now, table, final)
        self._rows.remove(Table.ACTIVE, "id = :id", id=final.id)
        return final
