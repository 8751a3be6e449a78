"""A background response's event log: its SSE frames, kept so a client can resume them.

A job's events are numbered and encoded once, as they are produced, and appended here
(`actors/job_events.py`); `GET /v1/responses/{id}?stream=true` replays the stored frames
byte for byte and then follows the log until its terminal frame (`http/resume.py`).
Every store backend keeps them in its own storage, in its own package: in memory
(`store/memory/event_log.py`), a table in the SQLite file (`store/sqlite/event_log.py`),
a Redis Stream per response (`store/redis/event_log.py`); the store actor opens each
backend with its event logs. This module holds what they share (the protocol, the
bounds, a read's answer, the doorbell) and imports none of them.

Bounds, the same in every backend (`EventLimits`): a log holds at most `max_events`
frames, and all logs together at most `max_bytes` (the responses' byte budget). A log
that would pass either is *truncated*: its frames are dropped and later ones are not
kept (a resume of it is refused), while the others' frames stay whole. Room is made
first by dropping the logs whose responses ended longest ago; a running job's log is
never dropped for another's. An ended log is kept as long as its response is (the
responses' TTL, or the ephemeral TTL for `store: false`), then dropped; a response
deleted by its tenant takes its log with it, in the same step (`delete_response`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import trio

from mlxcel.items import ResponseRecord
from mlxcel.store.limits import StoreLimits
from mlxcel.store.tables import Table, TableStatistics


@dataclass(frozen=True, slots=True)
class EventLimits:
    """How much the event logs may hold, and how long an ended one is kept."""

    max_events: int
    """Frames one response's log keeps; 0 keeps none (every log is truncated)."""
    max_bytes: int
    """Bytes of frames all logs keep together."""
    ttl_secs: float
    """How long an ended log of a stored response is kept (0: as long as the store runs)."""
    ephemeral_ttl_secs: float
    """The same for a `store: false` response."""

    @classmethod
    def of(cls, responses: StoreLimits, ephemeral_ttl: float, max_events: int) -> EventLimits:
        return cls(max_events, responses.max_bytes, responses.ttl_secs, ephemeral_ttl)

    def ttl_for(self, record: ResponseRecord) -> float:
        """How long the log of `record` is kept once it ends: as long as the record."""
        return self.ttl_secs if record.store else self.ephemeral_ttl_secs


@dataclass(frozen=True, slots=True)
class LogSlice:
    """What a read found: the frames numbered `after + 1` on (up to the read's limit)."""

    frames: tuple[bytes, ...]
    count: int
    """Frames appended so far, kept or not: the next one is numbered `count`."""
    ended: bool
    """The terminal frame was appended: nothing follows it."""
    truncated: bool
    """Frames were dropped (a cap or the byte budget): the log cannot be replayed."""


class EventLog(Protocol):
    """One backend's event logs; each operation is one atomic step of the backend."""

    limits: EventLimits

    async def append(
        self, response_id: str, first: int, frames: tuple[bytes, ...], *, end_ttl: float | None
    ) -> bool:
        """Append `frames`, numbered `first` on, when `first` is the log's count (else
        nothing changes: someone else numbered them). With `end_ttl`, the last frame is
        the terminal one and the log is kept `end_ttl` more seconds (0: no expiry).
        False when nothing was appended, or the frames were dropped (truncated)."""
        ...

    async def read(self, response_id: str, after: int, limit: int) -> LogSlice | None:
        """Up to `limit` frames numbered above `after`; None when there is no log (never
        written, expired, or dropped for room)."""
        ...

    async def wait(self, response_id: str, after: int) -> None:
        """Return once a frame numbered above `after` may be there (it may return
        early: the caller reads again); callers bound it with a deadline."""
        ...

    async def statistics(self) -> TableStatistics:
        """The logs kept and their frames' bytes, once the expired ones are dropped."""
        ...

    async def delete_response(self, response_id: str, tables: tuple[Table, ...]) -> bool:
        """Delete the response from the store's `tables` and drop its log, in one atomic
        step of the backend (a log must not outlive its deleted response: it holds the
        response's text); whether the response was in one of them. An append that comes
        later (the job's terminal frame, stored after its end) starts no log again: only
        frame 0 starts one."""
        ...


class Doorbell:
    """Wakes the readers waiting on a log when it grows in this process."""

    def __init__(self) -> None:
        self._bells: dict[str, tuple[trio.Event, list[None]]] = {}

    def ring(self, key: str) -> None:
        bell = self._bells.pop(key, None)
        if bell is not None:
            bell[0].set()

    async def wait(self, key: str) -> None:
        bell = self._bells.get(key)
        if bell is None:
            bell = self._bells[key] = (trio.Event(), [])
        event, waiters = bell
        waiters.append(None)
        try:
            await event.wait()
        finally:
            waiters.pop()
            if not waiters and self._bells.get(key) is bell:
                del self._bells[key]  # no reader left: nothing stays behind
