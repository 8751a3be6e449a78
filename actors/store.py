"""The store actor: the only owner of stored responses and conversation transcripts.

Each table charges its entries their approximate serialised JSON size against a byte
budget, caps their number, keeps them in LRU order (a read refreshes recency), and
expires them a fixed time after they were written; the clock is Trio's, so tests run on
the fake clock. The interface is narrow (put, get, delete, append, statistics) so another
backend can sit behind it later.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import time
from collections.abc import Callable
from typing import Any, TypeVar

import trio
from cachetools import Cache, TTLCache

from mlxcel.actors.item_index import ItemIndex, item_at
from mlxcel.actors.limits import StoreLimits
from mlxcel.actors.messages import (
    AddItems,
    ChangeConversation,
    ConversationChange,
    Delete,
    FindItems,
    Get,
    Put,
    ReadStatistics,
    Refused,
    RemoveItem,
    SetMetadata,
    StoreCommand,
    Stored,
    StoreStatistics,
    Table,
    TableStatistics,
)
from mlxcel.actors.replies import answer
from mlxcel.errors import NotFound
from mlxcel.items import Conversation, Item, ResponseRecord, is_minted_conversation_id

log = logging.getLogger(__name__)

_NO_EXPIRY = float("inf")
T = TypeVar("T")


def approx_json_size(value: Stored) -> int:
    """Roughly the bytes the value takes as JSON; what the byte budgets count."""
    return len(json.dumps(dataclasses.asdict(value), default=str).encode())


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

    def __init__(self, limits: StoreLimits, *, index: ItemIndex | None = None) -> None:
        self.limits = limits
        self.index = index
        """The items of the table's records by id (the response table keeps one)."""
        ttl = limits.ttl_secs if limits.ttl_secs > 0 else _NO_EXPIRY
        self._sized: tuple[Stored, int] | None = None
        self._cache: TTLCache[str, Stored] = _Cache(
            maxsize=limits.max_bytes,
            ttl=ttl,
            timer=trio.current_time,
            getsizeof=self._size,
            on_remove=index.remove if index is not None else lambda key: None,
        )

    def put(self, key: str, value: Stored) -> bool:
        """Store `value` under `key`; False (and what was there is kept) when it is larger
        than the whole budget."""
        if not self.limits.enabled:
            return False
        size = approx_json_size(value)
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

    def find_items(self, ids: frozenset[str]) -> dict[str, Item]:
        """The items with these ids among the table's live records (those found)."""
        found: dict[str, Item] = {}
        if self.index is None:
            return found
        for item_id in ids:
            for response_id, place in self.index.places(item_id):
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
        return approx_json_size(value)


class PinnedTable:
    """Entries that must not be evicted (unfinished background jobs); the job supervisor's
    cap bounds their number and its admission bounds their bytes."""

    def __init__(self) -> None:
        self._entries: dict[str, Stored] = {}

    def put(self, key: str, value: Stored) -> bool:
        self._entries[key] = value
        return True

    def get(self, key: str) -> Stored | None:
        return self._entries.get(key)

    def delete(self, key: str) -> bool:
        return self._entries.pop(key, None) is not None

    def statistics(self) -> TableStatistics:
        size = sum(approx_json_size(v) for v in self._entries.values())
        return TableStatistics(entries=len(self._entries), bytes=size)


class StoreHandle:
    """What other actors hold: one method per store command."""

    def __init__(
        self,
        inbox: trio.MemorySendChannel[StoreCommand],
        responses: StoreLimits,
        conversations: StoreLimits,
    ) -> None:
        self._inbox = inbox
        self.responses_limits = responses
        self.conversations_limits = conversations

    async def put(self, record: ResponseRecord, table: Table = Table.RESPONSES) -> bool:
        return await self._ask(lambda reply: Put(table, record, reply))

    async def get(
        self,
        response_id: str,
        tables: tuple[Table, ...] = (Table.ACTIVE, Table.RESPONSES, Table.EPHEMERAL),
    ) -> ResponseRecord | None:
        """A response wherever it is: an unfinished job, stored, or an ephemeral result."""
        value: Stored | None = await self._ask(lambda reply: Get(tables, response_id, reply))
        return value if isinstance(value, ResponseRecord) else None

    async def find_items(self, ids: frozenset[str]) -> dict[str, Item]:
        """Stored responses' input and output items by id (those found)."""
        return await self._ask(lambda reply: FindItems(ids, reply))

    async def delete(self, response_id: str, table: Table = Table.RESPONSES) -> bool:
        return await self._ask(lambda reply: Delete(table, response_id, reply))

    async def put_conversation(self, conversation: Conversation) -> bool:
        return await self._ask(lambda reply: Put(Table.CONVERSATIONS, conversation, reply))

    async def get_conversation(self, conversation_id: str) -> Conversation | None:
        """The transcript, or None when a free-form id has none yet.

        Raises NotFound when the id is one this server minted: that conversation was
        deleted or has expired, and continuing it must not silently start an empty one.
        """
        value: Stored | None = await self._ask(
            lambda reply: Get((Table.CONVERSATIONS,), conversation_id, reply)
        )
        if isinstance(value, Conversation):
            return value
        if is_minted_conversation_id(conversation_id):
            raise conversation_not_found(conversation_id)
        return None

    async def delete_conversation(self, conversation_id: str) -> bool:
        return await self._ask(lambda reply: Delete(Table.CONVERSATIONS, conversation_id, reply))

    async def append(
        self, conversation_id: str, items: tuple[Item, ...], *, response_id: str | None = None
    ) -> Conversation | None:
        """Append a response's turn, creating a free-form conversation when missing.

        Appending the same `response_id` again changes nothing. No client waits for this
        (the response has ended), so a refusal is logged and answered with None; the
        transcript stays as it was.
        """
        outcome = await self.change(conversation_id, AddItems(items, response_id), create=True)
        if isinstance(outcome, Conversation):
            return outcome
        if outcome is Refused.FULL:
            log.warning(
                "conversation %s is full (--conversation-store-max-bytes); the turn of "
                "response %s was not added to it",
                conversation_id,
                response_id,
            )
        else:
            log.warning(
                "conversation %s was deleted or has expired; the turn of response %s "
                "was not added to it",
                conversation_id,
                response_id,
            )
        return None

    async def change(
        self, conversation_id: str, change: ConversationChange, *, create: bool = False
    ) -> Conversation | Refused:
        return await self._ask(
            lambda reply: ChangeConversation(conversation_id, change, create, reply)
        )

    async def statistics(self) -> StoreStatistics:
        return await self._ask(ReadStatistics)

    async def _ask(self, make: Callable[[trio.MemorySendChannel[T]], StoreCommand]) -> T:
        send, recv = trio.open_memory_channel[T](1)
        await self._inbox.send(make(send))
        return await recv.receive()


class StoreActor:
    def __init__(
        self, responses: StoreLimits, conversations: StoreLimits, ephemeral_ttl_secs: float
    ) -> None:
        ephemeral = StoreLimits(responses.max_entries, responses.max_bytes, ephemeral_ttl_secs)
        self._tables: dict[Table, BoundedTable | PinnedTable] = {
            Table.RESPONSES: BoundedTable(responses, index=ItemIndex()),
            Table.CONVERSATIONS: BoundedTable(conversations),
            Table.EPHEMERAL: BoundedTable(ephemeral),
            Table.ACTIVE: PinnedTable(),
        }

    async def run(
        self, *, task_status: trio.TaskStatus[StoreHandle] = trio.TASK_STATUS_IGNORED
    ) -> None:
        """Serve store commands until cancelled.

        Resource handling: the inbox is unbuffered; every command is answered at once on
        its own one-slot reply channel, so callers never queue behind each other for long.
        Memory is bounded by each table's entry cap and byte budget.

        Error handling: a caller that left before its reply gets none (its closed reply
        channel is ignored); nothing else raises here.
        """
        send, recv = trio.open_memory_channel[StoreCommand](0)
        task_status.started(
            StoreHandle(send, self._limits(Table.RESPONSES), self._limits(Table.CONVERSATIONS))
        )
        async with recv:
            async for command in recv:
                self._handle(command)

    def _limits(self, table: Table) -> StoreLimits:
        found = self._tables[table]
        assert isinstance(found, BoundedTable)
        return found.limits

    def _handle(self, command: StoreCommand) -> None:
        match command:
            case Put(table, value, reply):
                answer(reply, self._tables[table].put(value.id, value))
            case Get(tables, key, reply):
                found = (self._tables[t].get(key) for t in tables)
                answer(reply, next((v for v in found if v is not None), None))
            case FindItems(ids, reply):
                responses = self._tables[Table.RESPONSES]
                assert isinstance(responses, BoundedTable)
                answer(reply, responses.find_items(ids))
            case Delete(table, key, reply):
                answer(reply, self._tables[table].delete(key))
            case ChangeConversation(conversation_id, change, create, reply):
                answer(reply, self._change(conversation_id, change, create))
            case ReadStatistics(reply):
                stats = StoreStatistics(
                    responses=self._tables[Table.RESPONSES].statistics(),
                    conversations=self._tables[Table.CONVERSATIONS].statistics(),
                    ephemeral=self._tables[Table.EPHEMERAL].statistics(),
                    active=self._tables[Table.ACTIVE].statistics(),
                )
                answer(reply, stats)

    def _change(
        self, conversation_id: str, change: ConversationChange, create: bool
    ) -> Conversation | Refused:
        table = self._tables[Table.CONVERSATIONS]
        current = table.get(conversation_id)
        if not isinstance(current, Conversation):
            if not create or is_minted_conversation_id(conversation_id):
                return Refused.MISSING
            current = Conversation(conversation_id, int(time.time()))
        match change:
            case AddItems(items, response_id):
                ids = current.response_ids
                if response_id is not None:
                    if response_id in ids:
                        return current  # this response's turn is already there
                    ids = (*ids, response_id)
                updated = dataclasses.replace(
                    current, items=current.items + items, response_ids=ids
                )
            case RemoveItem(item_id):
                kept = tuple(i for i in current.items if i.id != item_id)
                updated = dataclasses.replace(current, items=kept)
            case SetMetadata(metadata):
                updated = dataclasses.replace(current, metadata=dict(metadata))
        # A refused put keeps the transcript that was there.
        return updated if table.put(conversation_id, updated) else Refused.FULL


def conversation_not_found(conversation_id: str) -> NotFound:
    return NotFound(f"Conversation with id '{conversation_id[:64]}' not found.", code="not_found")
