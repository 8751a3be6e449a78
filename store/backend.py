"""What a store backend does: the one interface every kind of storage implements.

The store handle (`store/actor.py`) calls a backend directly, with no inbox between: each
operation below is one atomic step of the backend (code without a checkpoint for the
memory backend, one transaction on the store's own thread for SQLite), so concurrent
callers never see half an operation and never queue behind one inbox. Each operation's
docstring says what it does in that one step.

Time is the backend's injected clock (Trio's for the memory backend, so tests run on the
fake clock; the wall clock for a durable backend, so expiry means the same after a
restart). Sizes are the length of a value's encoding (`store/codec.py`), the same
for every backend.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Protocol, TypeVar

from mlxcel.items import (
    Conversation,
    Item,
    ResponseError,
    ResponseRecord,
    Usage,
    cancelled,
    failed,
    is_minted_conversation_id,
)
from mlxcel.store.codec import CodecError, decode_record
from mlxcel.store.deliveries import Deliveries
from mlxcel.store.tables import (
    AddItems,
    ConversationChange,
    Refused,
    RemoveItem,
    SetMetadata,
    Stored,
    StoreStatistics,
    Table,
)

log = logging.getLogger(__name__)

T = TypeVar("T")

RESTART_MESSAGE = "The server running this response stopped before it finished."
"""The error of a background job whose process ended before the job did."""

MAX_CHAIN_HOPS = 100_000
"""A `previous_response_id` walk stops here: ids are minted in order, so a real chain never
loops, and this bounds one that was forged into a store file by hand."""


@dataclass(frozen=True, slots=True)
class JobOwner:
    """Who runs a background job: a server process (`replica`) in one of its lives
    (`epoch`, new each start). A write that carries another epoch is refused."""

    replica: str
    epoch: str


@dataclass(frozen=True, slots=True)
class Chain:
    """A `previous_response_id` walk: the records found, newest first, and the id where
    the walk stopped because nothing live holds it (None when it reached the first turn)."""

    records: tuple[ResponseRecord, ...]
    missing: str | None = None


async def local_chain(
    local: Mapping[str, ResponseRecord],
    response_id: str,
    tenant: str,
    stored: Callable[[str, str], Awaitable[Chain]],
) -> Chain:
    """The chain from `response_id` through `local` (a connection's own records, the
    tenant's only) and `stored` (the backend's walk, from an id `local` lacks), newest
    first: each stretch of stored records is one call, and a stored record may continue
    a local one."""
    records: list[ResponseRecord] = []
    next_id: str | None = response_id
    while next_id is not None and len(records) < MAX_CHAIN_HOPS:
        found = local.get(next_id)
        if found is not None and found.tenant == tenant:
            records.append(found)
            next_id = found.echo.previous_response_id
            continue
        chain = await stored(next_id, tenant)
        records.extend(chain.records)
        if chain.missing is None or chain.missing not in local:
            return Chain(tuple(records), chain.missing)
        next_id = chain.missing
    return Chain(tuple(records))


@dataclass(frozen=True, slots=True)
class Charge:
    """What `charge` did to a counter: whether it `allowed` the amount (and added it),
    the counter's total in its window after the call, and the seconds until that
    window ends (the counter starts again from 0 then)."""

    allowed: bool
    used: int
    resets_in: float


class StoreBackend(Protocol):
    """Storage for responses, conversations and background jobs; see the module docstring."""

    @property
    def deliveries(self) -> Deliveries:
        """Pending webhook deliveries, kept by the same storage (`store/deliveries.py`)."""
        ...

    async def put(self, table: Table, value: Stored) -> bool:
        """Store `value` under its id in one step: drop the table's expired entries,
        replace what the id held, then evict least recently used entries until the
        value fits the byte budget and the table its entry cap.

        False (and what the id held is kept) when the table is disabled or the value is
        larger than its whole budget. `Table.ACTIVE` is not written here (jobs are)."""
        ...

    async def get(self, tables: tuple[Table, ...], key: str) -> Stored | None:
        """The live value under `key` in the first of `tables` that has it; reading it
        makes it the table's most recently used."""
        ...

    async def get_chain(self, response_id: str) -> Chain:
        """A `previous_response_id` walk from `response_id` in one step, through unfinished
        jobs and stored responses (never ephemeral results); each record read is touched
        as `get` touches it."""
        ...

    async def find_items(self, ids: frozenset[str], tenant: str = "") -> dict[str, Item]:
        """The stored responses' input and output items with these ids (those found); an
        id held by several records is taken from the newest stored, and found only when
        that record is `tenant`'s."""
        ...

    async def delete(self, table: Table, key: str) -> bool:
        """Remove `key` from `table` in one step; whether it was there."""
        ...

    async def change_conversation(
        self, conversation_id: str, change: ConversationChange, create: bool
    ) -> Conversation | Refused:
        """Read, change and write back one transcript in one step (no lost update between
        concurrent writers); with `create`, a missing free-form id is created first,
        exactly once. The changed transcript, or why nothing changed."""
        ...

    async def statistics(self) -> StoreStatistics:
        """Entries and bytes of each table once expired entries are dropped."""
        ...

    async def register_job(self, record: ResponseRecord, owner: JobOwner) -> None:
        """Pin a new job's `queued` record in `Table.ACTIVE` under `owner`."""
        ...

    async def update_job(self, record: ResponseRecord, owner: JobOwner) -> bool:
        """Replace an unfinished job's record, only if `owner` (same epoch) still holds
        it; False when fenced out."""
        ...

    async def finish_job(self, final: ResponseRecord, owner: JobOwner) -> ResponseRecord | None:
        """In one step, if `owner` still holds the job: store `final` where
        `final_table` says, or `too_large(final)` when it does not fit, and unpin the
        job. What was stored, or None when fenced out (the job is someone else's now)."""
        ...

    async def request_cancel(self, response_id: str) -> JobOwner | None:
        """Mark an unfinished job as asked to cancel; its owner, or None when no such job
        is unfinished. The owner stops it (and finishes it `cancelled`)."""
        ...

    async def reap(self, owner: JobOwner) -> int:
        """End every unfinished job held by any other owner or epoch that is gone
        `failed` with a `server_error` (`RESTART_MESSAGE`), or `cancelled` when a cancel
        was asked, as `finish_job` would; how many. A store only this process uses holds
        no other live owner, so it ends them all; a shared one spares the owners whose
        lease is live. Exactly once: a reaped job is no longer unfinished. A job whose
        stored bytes this release cannot read is left as it is (`UnreadableJobs`)."""
        ...

    async def remember(self, key: str, reasoning: str) -> None:
        """Keep a returned reasoning trace under its turn key, within the echo byte budget
        (least recently used first out); a trace larger than the whole budget is not
        kept."""
        ...

    async def recall(self, keys: tuple[str, ...]) -> dict[str, str]:
        """The traces kept under these keys (those found), each now the most recently
        used, in the order of `keys`."""
        ...

    async def charge(self, counter: str, amount: int, limit: int, window_secs: int) -> Charge:
        """Count `amount` against `counter` in the current fixed window of `window_secs`
        (windows begin at multiples of it in Unix time, so a day's begins at midnight
        UTC), in one step: when `limit` is 0, or fewer than `limit` were counted in this
        window, add `amount` and allow; else refuse and add nothing. So `amount` 1 with a
        limit admits at most `limit` calls a window, whatever the concurrency; `amount` 0
        asks whether the limit is reached; `limit` 0 adds what was spent regardless; a
        negative `amount` (with `limit` 0) returns part of a reservation, never taking
        the count below 0."""
        ...

    async def maintain(self) -> None:
        """Wait until housekeeping is due, then do it, beside the other operations
        (SQLite: copy its write-ahead log into the file once enough was written); the
        store actor calls it in a loop. Never raises but Cancelled."""
        ...

    async def aclose(self) -> None:
        """Release the storage (files, locks, connections); nothing is called after. It
        finishes even when the caller is cancelled (it shields itself where needed)."""
        ...


# --- what every backend computes the same way ----------------------------------------


def changed_conversation(
    current: Conversation | None, conversation_id: str, change: ConversationChange, create: bool
) -> Conversation | Refused:
    """The transcript `change` makes of `current` (None: not stored), or why it makes
    none; the backend then writes it back in the same step."""
    if current is None:
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
            return dataclasses.replace(current, items=current.items + items, response_ids=ids)
        case RemoveItem(item_id):
            kept = tuple(i for i in current.items if i.id != item_id)
            return dataclasses.replace(current, items=kept)
        case SetMetadata(metadata):
            return dataclasses.replace(current, metadata=dict(metadata))


def window(now: float, window_secs: int) -> tuple[int, float]:
    """The fixed window of `window_secs` holding the Unix time `now`: its start and the
    seconds left until it ends."""
    start = math.floor(now / window_secs) * window_secs
    return start, start + window_secs - now


def final_table(record: ResponseRecord) -> Table:
    """Where a job's final object goes: stored responses, or ephemeral results for
    `store: false`."""
    return Table.RESPONSES if record.store else Table.EPHEMERAL


def reaped(record: ResponseRecord, cancel_requested: bool) -> ResponseRecord:
    """The final object of a job whose owner is gone: what it held is kept, nothing is
    counted."""
    if cancel_requested:
        return cancelled(record, usage=Usage(), output=record.output)
    error = ResponseError("server_error", RESTART_MESSAGE)
    return failed(record, error, usage=Usage(), output=record.output)


def too_large(final: ResponseRecord) -> ResponseRecord:
    """What is stored instead of a job's final object larger than the whole byte budget,
    so polling still gets an answer: its usage, without its items (what did not fit)."""
    error = ResponseError(
        "server_error", "The response was larger than the response store's byte budget."
    )
    slim = dataclasses.replace(final, input_items=(), incomplete_reason=None)
    return failed(slim, error, usage=final.usage)


class UnreadableJobs:
    """What a backend's reaps find of the unfinished jobs stored in bytes this release
    cannot read (a later release's encoding, or damage). Ending one would write over what
    it holds with a record made up without it, so it is left as it is stored: its
    retrieval answers as any unreadable stored value does, and a release that reads it
    can end it. Each is warned about once, since a shared store reaps every third of a
    lease; only those the last reap found are remembered, so never more than the store's
    unfinished jobs."""

    def __init__(self) -> None:
        self._known: frozenset[str] = frozenset()

    def readable(self, jobs: Iterable[tuple[str, bytes, T]]) -> list[tuple[str, ResponseRecord, T]]:
        """Each of one reap's jobs (id, stored bytes, what the backend keeps beside) read
        back; those that cannot be are left out, and warned about by id and why (never
        their bytes)."""
        found: list[tuple[str, ResponseRecord, T]] = []
        unreadable: dict[str, str] = {}
        for job_id, body, beside in jobs:
            try:
                found.append((job_id, decode_record(body), beside))
            except CodecError as exc:
                unreadable[job_id] = str(exc)
        for job_id in sorted(unreadable.keys() - self._known):
            log.warning(
                "background response %s was unfinished when its server stopped, and its "
                "stored record cannot be read (%s); it is left as stored",
                job_id,
                unreadable[job_id],
            )
        self._known = frozenset(unreadable)
        return found
