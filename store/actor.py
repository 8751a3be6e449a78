"""The store: stored responses, conversation transcripts and background jobs.

`StoreActor` owns a backend (`store/backend.py`: in memory, a SQLite file that
survives restarts, or a Redis server several replicas share) for the server's life: it
opens it with its event logs (each backend's package keeps its own, in the same storage),
ends the jobs a previous process left unfinished, hands out a `StoreHandle`, and closes
the backend when cancelled. Callers use the handle's methods, which call the
backend directly: each backend operation is one atomic step, so no inbox serialises them.
On a shared store the actor also keeps this replica's lease (`store/replica.py`).
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import logging
import os
import socket
from collections.abc import AsyncIterator, Callable, Mapping

import trio

from mlxcel.errors import ConfigError, NotFound, StoreUnavailable
from mlxcel.items import (
    Conversation,
    Item,
    ResponseRecord,
    conversation_key,
    is_minted_conversation_id,
)
from mlxcel.store.backend import Chain, Charge, JobOwner, StoreBackend, local_chain
from mlxcel.store.deliveries import Deliveries
from mlxcel.store.echo import EchoHandle
from mlxcel.store.event_log import EventLimits, EventLog
from mlxcel.store.limits import StoreLimits, redis_url, sqlite_path
from mlxcel.store.memory import MemoryBackend, MemoryEventLog
from mlxcel.store.redis import RedisBackend, RedisEventLog
from mlxcel.store.replica import Membership, SharedStore, new_epoch
from mlxcel.store.sqlite import SqliteBackend, SqliteEventLog
from mlxcel.store.tables import AddItems, ConversationChange, Refused, StoreStatistics, Table

log = logging.getLogger(__name__)

ROUTED_CANCEL_WAIT_SECS = 5.0
"""How long a cancel asked for another replica's job waits for its owner to end it."""
ROUTED_CANCEL_POLL_SECS = 0.02
UNFINISHED = ("queued", "in_progress")


class StoreHandle:
    """What other actors hold: one method per store command."""

    def __init__(
        self,
        backend: StoreBackend,
        owner: JobOwner,
        responses: StoreLimits,
        conversations: StoreLimits,
        echo_enabled: bool = False,
        membership: Membership | None = None,
        events: EventLog | None = None,
    ) -> None:
        self._backend = backend
        self.events = events
        """Background responses' event logs (`store/event_log.py`); None: not kept."""
        self.echo = EchoHandle(backend, echo_enabled)
        """The reasoning-echo cache, kept by the same backend."""
        self._owner = owner
        self.membership = membership
        """This replica's lease in a shared store; None when no other process shares it."""
        self.responses_limits = responses
        self.conversations_limits = conversations
        self._local: Mapping[str, ResponseRecord] = {}

    @property
    def deliveries(self) -> Deliveries:
        """Pending webhook deliveries, kept where the jobs are (`store/deliveries.py`)."""
        return self._backend.deliveries

    @property
    def owner(self) -> JobOwner:
        """This process in this life: who the jobs it starts now are registered under."""
        return self.membership.owner if self.membership is not None else self._owner

    async def put(self, record: ResponseRecord, table: Table = Table.RESPONSES) -> bool:
        return await self._backend.put(table, record)

    async def get(
        self,
        response_id: str,
        tables: tuple[Table, ...] = (Table.ACTIVE, Table.RESPONSES, Table.EPHEMERAL),
        *,
        tenant: str | None = None,
    ) -> ResponseRecord | None:
        """A response wherever it is: an unfinished job, stored, or an ephemeral result.

        With `tenant`, only one of that tenant's: another's answers None, as a missing
        id does."""
        value = await self._backend.get(tables, response_id)
        if not isinstance(value, ResponseRecord):
            return None
        return value if tenant is None or value.tenant == tenant else None

    def with_local(self, local: Mapping[str, ResponseRecord]) -> StoreHandle:
        """This handle, whose chains also walk `local`: responses one connection keeps
        for itself (a WebSocket's `store: false` ones), found by it alone."""
        handle = copy.copy(self)
        handle._local = local
        return handle

    async def get_chain(self, response_id: str, *, tenant: str = "") -> Chain:
        """A `previous_response_id` walk from `response_id`, newest first, through this
        handle's local records and the backend's (one call per stored stretch)."""
        return await local_chain(self._local, response_id, tenant, self._stored_chain)

    async def _stored_chain(self, response_id: str, tenant: str) -> Chain:
        """The backend's walk; a record of another tenant ends it as missing (as one
        that expired)."""
        chain = await self._backend.get_chain(response_id)
        for place, record in enumerate(chain.records):
            if record.tenant != tenant:
                return Chain(chain.records[:place], record.id)
        return chain

    async def find_items(self, ids: frozenset[str], *, tenant: str = "") -> dict[str, Item]:
        """The tenant's stored responses' input and output items by id (those found)."""
        return await self._backend.find_items(ids, tenant)

    async def delete(self, response_id: str, table: Table = Table.RESPONSES) -> bool:
        return await self._backend.delete(table, response_id)

    async def delete_response(self, response_id: str) -> bool:
        """Delete a finished response, stored or ephemeral, with its event log (in one
        step of the backend); whether it was there."""
        tables = (Table.RESPONSES, Table.EPHEMERAL)
        if self.events is not None:
            return await self.events.delete_response(response_id, tables)
        found = [await self._backend.delete(table, response_id) for table in tables]
        return any(found)

    # --- conversations: each tenant's ids are its own (`conversation_key`) -------------

    async def put_conversation(self, conversation: Conversation, *, tenant: str = "") -> bool:
        """Store a new conversation under the tenant's key for its id."""
        keyed = dataclasses.replace(conversation, id=conversation_key(tenant, conversation.id))
        return await self._backend.put(Table.CONVERSATIONS, keyed)

    async def get_conversation(
        self, conversation_id: str, *, tenant: str = ""
    ) -> Conversation | None:
        """The tenant's transcript, or None when a free-form id has none yet.

        Raises NotFound when the id is one this server minted: that conversation was
        deleted or has expired (or is another tenant's), and continuing it must not
        silently start an empty one.
        """
        key = conversation_key(tenant, conversation_id)
        value = await self._backend.get((Table.CONVERSATIONS,), key)
        if isinstance(value, Conversation):
            return value
        if is_minted_conversation_id(conversation_id):
            raise conversation_not_found(conversation_id)
        return None

    async def delete_conversation(self, conversation_id: str, *, tenant: str = "") -> bool:
        key = conversation_key(tenant, conversation_id)
        return await self._backend.delete(Table.CONVERSATIONS, key)

    async def append(
        self,
        conversation_id: str,
        items: tuple[Item, ...],
        *,
        response_id: str | None = None,
        tenant: str = "",
    ) -> Conversation | None:
        """Append a response's turn, creating a free-form conversation when missing.

        Appending the same `response_id` again changes nothing. No client waits for this
        (the response has ended), so a refusal is logged and answered with None; the
        transcript stays as it was.
        """
        change = AddItems(items, response_id)
        outcome = await self.change(conversation_id, change, create=True, tenant=tenant)
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
        self,
        conversation_id: str,
        change: ConversationChange,
        *,
        create: bool = False,
        tenant: str = "",
    ) -> Conversation | Refused:
        key = conversation_key(tenant, conversation_id)
        return await self._backend.change_conversation(key, change, create)

    async def statistics(self) -> StoreStatistics:
        return await self._backend.statistics()

    async def charge(self, counter: str, amount: int, limit: int, window_secs: int) -> Charge:
        """Count against a rate limit, on every replica sharing the store (see
        `StoreBackend.charge`)."""
        return await self._backend.charge(counter, amount, limit, window_secs)

    # --- background jobs: this process is their owner --------------------------------

    async def register_job(self, record: ResponseRecord) -> JobOwner:
        """Pin a new job's `queued` record (never evicted until it ends); who holds it."""
        owner = self._owner if self.membership is None else await self.membership.current()
        await self._backend.register_job(record, owner)
        return owner

    async def update_job(self, record: ResponseRecord, owner: JobOwner) -> bool:
        """Record an unfinished job's progress; False when `owner` no longer holds it."""
        return await self._backend.update_job(record, owner)

    async def finish_job(self, final: ResponseRecord, owner: JobOwner) -> ResponseRecord | None:
        """Store a job's final object (or the small `failed` one when it does not fit)
        and unpin the job, in one step; what was stored, None when `owner` no longer
        holds it."""
        return await self._backend.finish_job(final, owner)

    async def cancel_elsewhere(self, response_id: str) -> ResponseRecord | None:
        """Ask the owner of an unfinished job this process does not run to cancel it,
        and wait (up to `ROUTED_CANCEL_WAIT_SECS`) for the end it stores; the record as
        it then is, or None when it is not stored at all."""
        if await self._backend.request_cancel(response_id) is not None:
            await self._backend.reap(self.owner)  # an owner already gone ends it `cancelled` now
        with trio.move_on_after(ROUTED_CANCEL_WAIT_SECS):
            while True:
                record = await self.get(response_id)
                if record is None or record.status not in UNFINISHED:
                    return record
                await trio.sleep(ROUTED_CANCEL_POLL_SECS)
        return await self.get(response_id)


class StoreActor:
    """Owns the store's backend for the server's life."""

    def __init__(
        self,
        responses: StoreLimits,
        conversations: StoreLimits,
        ephemeral_ttl_secs: float,
        *,
        store: str = "memory",
        echo_bytes: int = 0,
        clock: Callable[[], float] | None = None,
        key_prefix: str = "mlxcel",
        lease_secs: float = 15.0,
        max_events_per_response: int = 0,
    ) -> None:
        self._responses = responses
        self._conversations = conversations
        self._ephemeral = StoreLimits(
            responses.max_entries, responses.max_bytes, ephemeral_ttl_secs
        )
        self._path = sqlite_path(store)
        self._url = redis_url(store)
        self._echo_bytes = echo_bytes
        self._clock = clock
        self._key_prefix = key_prefix
        self._lease_secs = lease_secs
        self._event_limits = EventLimits.of(responses, ephemeral_ttl_secs, max_events_per_response)

    async def run(
        self, *, task_status: trio.TaskStatus[StoreHandle] = trio.TASK_STATUS_IGNORED
    ) -> None:
        """`open` the store and serve until cancelled (an actor's life in a nursery)."""
        async with self.open() as handle:
            task_status.started(handle)
            await trio.sleep_forever()

    @contextlib.asynccontextmanager
    async def open(self) -> AsyncIterator[StoreHandle]:
        """Open the backend, end the jobs an earlier process left unfinished, and hand
        out the handle; close the backend when the block ends.

        Resource handling: memory is bounded by each table's entry cap and byte budget;
        a SQLite store holds its file's lock (one server per file) until closed, and the
        close is shielded so a cancel cannot skip it. A task beside the block runs the
        backend's housekeeping whenever it is due (SQLite copies its log into the file
        there, so that no write waits for it). The server opens its store around
        the nursery of every other actor, so the store closes only after the last of
        them (a job storing its end under a shield) is done.

        On a shared store, this replica takes its lease before it reaps (so it ends only
        the jobs of replicas whose lease is gone), keeps it beside the block, and gives it
        up after the block, once the last job's end is stored.

        Error handling: a SQLite file another server holds, or one this release cannot
        read, or a Redis server that cannot be reached or evicts keys on its own, is a
        ConfigError before the server starts serving.
        """
        backend, events, shared = await self._open()
        try:
            replica = f"{socket.gethostname()}:{os.getpid()}"
            membership = None
            if shared is not None:
                membership = Membership(shared, replica, self._lease_secs)
                try:
                    await membership.join()
                except StoreUnavailable as exc:
                    raise ConfigError("the shared store stopped answering at start-up") from exc
            owner = membership.owner if membership else JobOwner(replica, new_epoch())
            ended = await backend.reap(owner)
            if ended:
                log.warning(
                    "%d background responses were unfinished when their server stopped; "
                    "they now answer failed",
                    ended,
                )
            async with trio.open_nursery() as nursery:
                nursery.start_soon(_maintain, backend)
                if membership is not None:
                    nursery.start_soon(membership.keep)
                yield StoreHandle(
                    backend,
                    owner,
                    self._responses,
                    self._conversations,
                    self._echo_bytes > 0,
                    membership,
                    events,
                )
                nursery.cancel_scope.cancel()
            if membership is not None:
                with trio.CancelScope(shield=True):
                    await membership.leave()
        finally:
            # Not in a cancel scope of ours: each backend's close finishes even when
            # cancelled (SQLite shields itself), and the Redis client's task group must be
            # left at the depth it was entered, not inside a newer scope.
            await backend.aclose()

    async def _open(self) -> tuple[StoreBackend, EventLog, SharedStore | None]:
        """The backend `--store` names with its event logs, kept in the same storage;
        the backend again as a shared store when other replicas share it."""
        limits = self._event_limits
        if self._url is not None:
            redis = await RedisBackend.open(
                self._url,
                self._key_prefix,
                self._responses,
                self._conversations,
                self._ephemeral,
                echo_bytes=self._echo_bytes,
                clock=self._clock,
            )
            return redis, RedisEventLog(redis, limits), redis
        if self._path is not None:
            sqlite = await SqliteBackend.open(
                self._path,
                self._responses,
                self._conversations,
                self._ephemeral,
                echo_bytes=self._echo_bytes,
                clock=self._clock,
            )
            return sqlite, SqliteEventLog(sqlite, limits), None
        memory = MemoryBackend(
            self._responses,
            self._conversations,
            self._ephemeral,
            echo_bytes=self._echo_bytes,
            clock=self._clock or trio.current_time,
        )
        return memory, MemoryEventLog(limits, memory.clock, memory.remove), None


async def _maintain(backend: StoreBackend) -> None:
    """The backend's housekeeping, whenever it is due, until cancelled."""
    while True:
        await backend.maintain()


def conversation_not_found(conversation_id: str) -> NotFound:
    return NotFound(f"Conversation with id '{conversation_id[:64]}' not found.", code="not_found")
