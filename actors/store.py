"""The store: stored responses, conversation transcripts and background jobs.

`StoreActor` owns a backend (`actors/store_backend.py`: in memory, or a SQLite file that
survives restarts) for the server's life: it opens it, ends the jobs a previous process
left unfinished, hands out a `StoreHandle`, and closes the backend when cancelled. Callers
use the handle's methods, which call the backend directly: each backend operation is one
atomic step, so no inbox serialises them.
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import uuid
from collections.abc import AsyncIterator, Callable

import trio

from mlxcel.actors.echo import EchoHandle
from mlxcel.actors.limits import StoreLimits, sqlite_path
from mlxcel.actors.messages import (
    AddItems,
    ConversationChange,
    Refused,
    StoreStatistics,
    Table,
)
from mlxcel.actors.store_backend import Chain, JobOwner, StoreBackend
from mlxcel.actors.store_memory import MemoryBackend
from mlxcel.errors import NotFound
from mlxcel.items import Conversation, Item, ResponseRecord, is_minted_conversation_id

log = logging.getLogger(__name__)


class StoreHandle:
    """What other actors hold: one method per store command."""

    def __init__(
        self,
        backend: StoreBackend,
        owner: JobOwner,
        responses: StoreLimits,
        conversations: StoreLimits,
        echo_enabled: bool = False,
    ) -> None:
        self._backend = backend
        self.echo = EchoHandle(backend, echo_enabled)
        """The reasoning-echo cache, kept by the same backend."""
        self.owner = owner
        """This process in this life: the owner of the jobs it runs."""
        self.responses_limits = responses
        self.conversations_limits = conversations

    async def put(self, record: ResponseRecord, table: Table = Table.RESPONSES) -> bool:
        return await self._backend.put(table, record)

    async def get(
        self,
        response_id: str,
        tables: tuple[Table, ...] = (Table.ACTIVE, Table.RESPONSES, Table.EPHEMERAL),
    ) -> ResponseRecord | None:
        """A response wherever it is: an unfinished job, stored, or an ephemeral result."""
        value = await self._backend.get(tables, response_id)
        return value if isinstance(value, ResponseRecord) else None

    async def get_chain(self, response_id: str) -> Chain:
        """A `previous_response_id` walk from `response_id`, newest first, in one call."""
        return await self._backend.get_chain(response_id)

    async def find_items(self, ids: frozenset[str]) -> dict[str, Item]:
        """Stored responses' input and output items by id (those found)."""
        return await self._backend.find_items(ids)

    async def delete(self, response_id: str, table: Table = Table.RESPONSES) -> bool:
        return await self._backend.delete(table, response_id)

    async def put_conversation(self, conversation: Conversation) -> bool:
        return await self._backend.put(Table.CONVERSATIONS, conversation)

    async def get_conversation(self, conversation_id: str) -> Conversation | None:
        """The transcript, or None when a free-form id has none yet.

        Raises NotFound when the id is one this server minted: that conversation was
        deleted or has expired, and continuing it must not silently start an empty one.
        """
        value = await self._backend.get((Table.CONVERSATIONS,), conversation_id)
        if isinstance(value, Conversation):
            return value
        if is_minted_conversation_id(conversation_id):
            raise conversation_not_found(conversation_id)
        return None

    async def delete_conversation(self, conversation_id: str) -> bool:
        return await self._backend.delete(Table.CONVERSATIONS, conversation_id)

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
        return await self._backend.change_conversation(conversation_id, change, create)

    async def statistics(self) -> StoreStatistics:
        return await self._backend.statistics()

    # --- background jobs: this process is their owner --------------------------------

    async def register_job(self, record: ResponseRecord) -> None:
        """Pin a new job's `queued` record (never evicted until it ends)."""
        await self._backend.register_job(record, self.owner)

    async def update_job(self, record: ResponseRecord) -> bool:
        """Record an unfinished job's progress; False when it is no longer ours."""
        return await self._backend.update_job(record, self.owner)

    async def finish_job(self, final: ResponseRecord) -> ResponseRecord | None:
        """Store a job's final object (or the small `failed` one when it does not fit)
        and unpin the job, in one step; what was stored, None when it is no longer ours."""
        return await self._backend.finish_job(final, self.owner)


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
    ) -> None:
        self._responses = responses
        self._conversations = conversations
        self._ephemeral = StoreLimits(
            responses.max_entries, responses.max_bytes, ephemeral_ttl_secs
        )
        self._path = sqlite_path(store)
        self._echo_bytes = echo_bytes
        self._clock = clock

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

        Error handling: a SQLite file another server holds, or one this release cannot
        read, is a ConfigError before the server starts serving.
        """
        backend = await self._open()
        try:
            owner = JobOwner(f"{socket.gethostname()}:{os.getpid()}", uuid.uuid4().hex)
            ended = await backend.reap(owner)
            if ended:
                log.warning(
                    "%d background responses were unfinished at the last stop; "
                    "they now answer failed",
                    ended,
                )
            async with trio.open_nursery() as nursery:
                nursery.start_soon(_maintain, backend)
                yield StoreHandle(
                    backend, owner, self._responses, self._conversations, self._echo_bytes > 0
                )
                nursery.cancel_scope.cancel()
        finally:
            with trio.CancelScope(shield=True):
                await backend.aclose()

    async def _open(self) -> StoreBackend:
        if self._path is None:
            clock = self._clock or trio.current_time
            return MemoryBackend(
                self._responses,
                self._conversations,
                self._ephemeral,
                echo_bytes=self._echo_bytes,
                clock=clock,
            )
        from mlxcel.actors.store_sqlite import SqliteBackend

        return await SqliteBackend.open(
            self._path,
            self._responses,
            self._conversations,
            self._ephemeral,
            echo_bytes=self._echo_bytes,
            clock=self._clock,
        )


async def _maintain(backend: StoreBackend) -> None:
    """The backend's housekeeping, whenever it is due, until cancelled."""
    while True:
        await backend.maintain()


def conversation_not_found(conversation_id: str) -> NotFound:
    return NotFound(f"Conversation with id '{conversation_id[:64]}' not found.", code="not_found")
