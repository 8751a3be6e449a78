"""The memory backend: every table in this process's memory, gone when it ends.

Each bounded table is cachetools' TTL + LRU + size-budget cache with an entry cap on top;
unfinished jobs sit in a pinned table no budget evicts. No operation awaits anything
before it is done, so each is atomic under Trio; the clock is injected (Trio's by
default, so tests run on the fake clock). Rate-limit windows are counted on the same
clock, shifted to Unix time by the offset read when the backend is made, so a day's
window still begins at midnight UTC.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import trio
from cachetools import Cache, LRUCache, TTLCache

from mlxcel.items import Conversation, Item, ResponseRecord
from mlxcel.store.backend import (
    MAX_CHAIN_HOPS,
    Chain,
    Charge,
    JobOwner,
    changed_conversation,
    final_table,
    reaped,
    too_large,
    window,
)
from mlxcel.store.codec import encoded_size
from mlxcel.store.deliveries import MemoryDeliveries
from mlxcel.store.item_index import ItemIndex, item_at
from mlxcel.store.limits import StoreLimits
from mlxcel.store.tables import (
    ConversationChange,
    Refused,
    Stored,
    StoreStatistics,
    Table,
    TableStatistics,
)

log = logging.getLogger(__name__)

_NO_EXPIRY = float("inf")


class _Cache(TTLCache[str, Stored]):
    """cachetools' cache, telling `on_remove` each key it drops: deleted, evicted for
    room or expired."""

    def __init__(self, *args: Any, on_remove: Callable[[str], None], **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._on_remove = on_remove

    def __delitem__(self, key: str) -> None:  # deletes and evictions (`popitem`)
        present = Cache.__contains__(self, key)
        try:
            super().__delitem__(key)
        finally:
            if present:  # an expired key is removed, then reported missing
                self._on_remove(key)

    def expire(self, time: float | None = None) -> list[tuple[str, Stored]]:
        expired = list(super().expire(time))
        for key, _ in expired:
            self._on_remove(key)
        return expired


class BoundedTable:
    """One table: an entry cap on top of cachetools' TTL + LRU + size-budget cache."""

    def __init__(
        self,
        limits: StoreLimits,
        *,
        index: ItemIndex | None = None,
        clock: Callable[[], float] = trio.current_time,
    ) -> None:
        self.limits = limits
        self.index = index
        """The items of the table's records by id (the response table keeps one)."""
        ttl = limits.ttl_secs if limits.ttl_secs > 0 else _NO_EXPIRY
        self._sized: tuple[Stored, int] | None = None
        self._cache: TTLCache[str, Stored] = _Cache(
            maxsize=limits.max_bytes,
            ttl=ttl,
            timer=clock,
            getsizeof=self._size,
            on_remove=index.remove if index is not None else lambda key: None,
        )

    def put(self, key: str, value: Stored) -> bool:
        """Store `value` under `key`; False (and what was there is kept) when it is larger
        than the whole budget."""
        if not self.limits.enabled:
            return False
        size = encoded_size(value)
        if size > self.limits.max_bytes:
            log.info("%s is larger than its store's byte budget; not kept", key)
            return False
        self._cache.pop(key, None)  # replacing a key never double-counts
        self._sized = (value, size)  # measured once, not again by the cache
        try:
            self._cache[key] = value  # fits: the cache evicts others to make room
        finally:
            self._sized = None
        while len(self._cache) > self.limits.max_entries:
            self._cache.popitem()
        if self.index is not None and isinstance(value, ResponseRecord):
            self.index.add(value)
        return True

    def find_items(self, ids: frozenset[str], tenant: str = "") -> dict[str, Item]:
        """The items with these ids among the tenant's live records (those found), each
        from the newest record holding it."""
        found: dict[str, Item] = {}
        if self.index is None:
            return found
        for item_id in sorted(ids):  # a fixed order of LRU touches, as in every backend
            for response_id, place in self.index.places(tenant, item_id):
                record = self._cache.get(response_id)
                item = item_at(record, place) if isinstance(record, ResponseRecord) else None
                if item is not None and item.id == item_id:
                    found[item_id] = item
                    break
        return found

    def get(self, key: str) -> Stored | None:
        return self._cache.get(key)

    def delete(self, key: str) -> bool:
        return self._cache.pop(key, None) is not None

    def statistics(self) -> TableStatistics:
        self._cache.expire()
        return TableStatistics(entries=len(self._cache), bytes=int(self._cache.currsize))

    def _size(self, value: Stored) -> int:
        if self._sized is not None and self._sized[0] is value:
            return self._sized[1]
        return encoded_size(value)


@dataclass(slots=True)
class _Pinned:
    record: ResponseRecord
    owner: JobOwner
    size: int
    cancel_requested: bool = False


class MemoryBackend:
    """`StoreBackend` in this process's memory (see `store/backend.py`)."""

    def __init__(
        self,
        responses: StoreLimits,
        conversations: StoreLimits,
        ephemeral: StoreLimits,
        *,
        echo_bytes: int = 0,
        clock: Callable[[], float] = trio.current_time,
        unix_offset: float | None = None,
    ) -> None:
        """`unix_offset` is what `clock` lacks of Unix time (read now when not given)."""
        self._echo_bytes = echo_bytes
        self._clock = clock
        self._unix_offset = time.time() - clock() if unix_offset is None else unix_offset
        self._counters: dict[tuple[str, int], tuple[int, int]] = {}
        """(counter, window length) → (its latest window's start, the count in it); one
        entry per counter, so they are as many as the tenants times the kinds of limit."""
        self._traces: LRUCache[str, str] = LRUCache(
            maxsize=max(echo_bytes, 1), getsizeof=lambda text: len(text.encode())
        )
        self._tables: dict[Table, BoundedTable] = {
            Table.RESPONSES: BoundedTable(responses, index=ItemIndex(), clock=clock),
            Table.CONVERSATIONS: BoundedTable(conversations, clock=clock),
            Table.EPHEMERAL: BoundedTable(ephemeral, clock=clock),
        }
        self._active: dict[str, _Pinned] = {}
        self.deliveries = MemoryDeliveries(clock)
        """Pending webhook deliveries (`store/deliveries.py`)."""

    async def put(self, table: Table, value: Stored) -> bool:
        try:
            return self._tables[table].put(value.id, value)
        finally:
            await trio.lowlevel.cancel_shielded_checkpoint()

    async def get(self, tables: tuple[Table, ...], key: str) -> Stored | None:
        try:
            return self._get(tables, key)
        finally:
            await trio.lowlevel.cancel_shielded_checkpoint()

    async def get_chain(self, response_id: str) -> Chain:
        records: list[ResponseRecord] = []
        next_id: str | None = response_id
        while next_id is not None and len(records) < MAX_CHAIN_HOPS:
            record = self._get((Table.ACTIVE, Table.RESPONSES), next_id)
            if not isinstance(record, ResponseRecord):
                await trio.lowlevel.cancel_shielded_checkpoint()
                return Chain(tuple(records), next_id)
            records.append(record)
            next_id = record.echo.previous_response_id
        await trio.lowlevel.cancel_shielded_checkpoint()
        return Chain(tuple(records))

    async def find_items(self, ids: frozenset[str], tenant: str = "") -> dict[str, Item]:
        try:
            return self._tables[Table.RESPONSES].find_items(ids, tenant)
        finally:
            await trio.lowlevel.cancel_shielded_checkpoint()

    async def delete(self, table: Table, key: str) -> bool:
        try:
            return self.remove(table, key)
        finally:
            await trio.lowlevel.cancel_shielded_checkpoint()

    def remove(self, table: Table, key: str) -> bool:
        """`delete` without its checkpoint, for a caller that removes more in the same
        step (the event log drops a deleted response's log with it)."""
        if table is Table.ACTIVE:
            return self._active.pop(key, None) is not None
        return self._tables[table].delete(key)

    async def change_conversation(
        self, conversation_id: str, change: ConversationChange, create: bool
    ) -> Conversation | Refused:
        try:
            table = self._tables[Table.CONVERSATIONS]
            current = table.get(conversation_id)
            if not isinstance(current, Conversation):
                current = None
            updated = changed_conversation(current, conversation_id, change, create)
            if isinstance(updated, Refused) or updated is current:
                return updated
            # A refused put keeps the transcript that was there.
            return updated if table.put(conversation_id, updated) else Refused.FULL
        finally:
            await trio.lowlevel.cancel_shielded_checkpoint()

    async def statistics(self) -> StoreStatistics:
        try:
            return StoreStatistics(
                responses=self._tables[Table.RESPONSES].statistics(),
                conversations=self._tables[Table.CONVERSATIONS].statistics(),
                ephemeral=self._tables[Table.EPHEMERAL].statistics(),
                active=TableStatistics(
                    entries=len(self._active), bytes=sum(p.size for p in self._active.values())
                ),
            )
        finally:
            await trio.lowlevel.cancel_shielded_checkpoint()

    async def register_job(self, record: ResponseRecord, owner: JobOwner) -> None:
        self._active.pop(record.id, None)  # registered again: reaped in its new place
        self._active[record.id] = _Pinned(record, owner, encoded_size(record))
        await trio.lowlevel.cancel_shielded_checkpoint()

    async def update_job(self, record: ResponseRecord, owner: JobOwner) -> bool:
        try:
            pinned = self._active.get(record.id)
            if pinned is None or pinned.owner != owner:
                return False
            pinned.record, pinned.size = record, encoded_size(record)
            return True
        finally:
            await trio.lowlevel.cancel_shielded_checkpoint()

    async def finish_job(self, final: ResponseRecord, owner: JobOwner) -> ResponseRecord | None:
        try:
            pinned = self._active.get(final.id)
            if pinned is None or pinned.owner != owner:
                return None
            return self._finish(final)
        finally:
            await trio.lowlevel.cancel_shielded_checkpoint()

    async def request_cancel(self, response_id: str) -> JobOwner | None:
        try:
            pinned = self._active.get(response_id)
            if pinned is None:
                return None
            pinned.cancel_requested = True
            return pinned.owner
        finally:
            await trio.lowlevel.cancel_shielded_checkpoint()

    async def reap(self, owner: JobOwner) -> int:
        try:
            orphans = [p for p in self._active.values() if p.owner != owner]
            for pinned in orphans:
                self._finish(reaped(pinned.record, pinned.cancel_requested))
            return len(orphans)
        finally:
            await trio.lowlevel.cancel_shielded_checkpoint()

    async def remember(self, key: str, reasoning: str) -> None:
        if len(reasoning.encode()) <= self._echo_bytes:  # else what was there stays
            self._traces.pop(key, None)  # a replaced trace is never counted twice
            self._traces[key] = reasoning
        await trio.lowlevel.cancel_shielded_checkpoint()

    async def recall(self, keys: tuple[str, ...]) -> dict[str, str]:
        found = {k: self._traces[k] for k in keys if k in self._traces}
        await trio.lowlevel.cancel_shielded_checkpoint()
        return found

    async def charge(self, counter: str, amount: int, limit: int, window_secs: int) -> Charge:
        start, resets_in = window(self._clock() + self._unix_offset, window_secs)
        held = self._counters.get((counter, window_secs))
        used = held[1] if held is not None and held[0] == start else 0
        allowed = limit == 0 or used < limit
        if allowed and (amount > 0 or (amount < 0 and used > 0)):
            used = max(0, used + amount)
            self._counters[(counter, window_secs)] = (start, used)
        await trio.lowlevel.cancel_shielded_checkpoint()
        return Charge(allowed, used, resets_in)

    async def maintain(self) -> None:
        await trio.sleep_forever()  # nothing is ever due: expiry happens as tables are used

    async def aclose(self) -> None:
        with trio.CancelScope(shield=True):
            await trio.lowlevel.checkpoint()

    def _finish(self, final: ResponseRecord) -> ResponseRecord:
        table = self._tables[final_table(final)]
        if not table.put(final.id, final):
            final = too_large(final)
            table.put(final.id, final)
        del self._active[final.id]
        return final

    def _get(self, tables: tuple[Table, ...], key: str) -> Stored | None:
        for table in tables:
            if table is Table.ACTIVE:
                pinned = self._active.get(key)
                if pinned is not None:
                    return pinned.record
                continue
            found = self._tables[table].get(key)
            if found is not None:
                return found
        return None

    @property
    def clock(self) -> Callable[[], float]:
        """The clock its expiry runs on (the event logs kept beside share it)."""
        return self._clock

    def limits(self, table: Table) -> StoreLimits:
        return self._tables[table].limits
