"""A background job's event log, written as the job runs (`store/event_log.py`).

The job numbers and encodes each of its events once, as it is produced, and a recorder
task beside it appends them to the store's log in batches, so a client can read them
(`GET /v1/responses/{id}?stream=true`) from any point, on any replica, byte for byte
as first written. The log begins with `response.created` and `response.queued` (both
appended before the job is answered, so a resume right after the create finds them),
then holds every event the job's slot produces but keep-alives, and ends with the
terminal event of the final object as stored (after the store has it: a reader that
sees it and retrieves the response gets the same object).

Resource handling: the encoded frames wait in a bounded channel; a store slower than
the model makes the job wait on it (its slot does not: the job's stream has room for
the whole response). A store that fails stops the recording (the frames are dropped and
the log is left as it was); the job itself runs on. Nothing here catches a cancel.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import trio

from mlxcel.errors import StoreUnavailable
from mlxcel.items import ResponseRecord
from mlxcel.respond.events import (
    KeepAlive,
    PromptRead,
    ResponseCreated,
    ResponseEvent,
    ResponseFinished,
    ResponseQueued,
)
from mlxcel.store import EventLog

log = logging.getLogger(__name__)

FrameEncoder = Callable[[ResponseEvent | ResponseQueued, int], bytes]
"""An event's SSE frame with its sequence number (`http/sse.py`'s `numbered_frame`)."""

RECORD_BUFFER = 256
"""Frames encoded and not yet handed to the store."""
BATCH_FRAMES = 256
"""Frames appended in one store operation at most."""


class EventRecorder:
    """Numbers, encodes and appends one job's events to its log."""

    def __init__(self, events: EventLog, encode: FrameEncoder, response_id: str) -> None:
        self._events = events
        self._encode = encode
        self._id = response_id
        self._numbered = 0
        """The next frame's sequence number."""
        self._appended = 0
        """The frames handed to the log so far: the next append's first number."""
        self._failed = False
        self._send, self._recv = trio.open_memory_channel[bytes](RECORD_BUFFER)

    async def begin(self, queued: ResponseRecord) -> None:
        """Start the log: `response.created` and `response.queued`, in one append."""
        frames = (self._frame(ResponseCreated(queued)), self._frame(ResponseQueued(queued)))
        await self._append(frames, None)

    async def record(self, event: ResponseEvent) -> None:
        """Queue the frame of `event`; keep-alives, the prompt's read (no Responses frame
        shows it) and the scheduler's end are not kept (`finish` appends the end as
        stored)."""
        if not isinstance(event, KeepAlive | PromptRead | ResponseFinished):
            await self._send.send(self._frame(event))

    async def run(self) -> None:
        """Append the queued frames in batches until `close` (then the rest)."""
        async with self._recv:
            async for frame in self._recv:
                batch = [frame]
                while len(batch) < BATCH_FRAMES:
                    try:
                        batch.append(self._recv.receive_nowait())
                    except (trio.WouldBlock, trio.EndOfChannel):
                        break
                await self._append(tuple(batch), None)

    def close(self) -> None:
        """No more events: `run` appends what is queued and returns."""
        self._send.close()

    async def finish(self, final: ResponseRecord) -> None:
        """Append the terminal event of `final` (as stored) and end the log: it is kept
        as long as the response is."""
        frame = self._frame(ResponseFinished(final))
        await self._append((frame,), self._events.limits.ttl_for(final))

    def _frame(self, event: ResponseEvent | ResponseQueued) -> bytes:
        frame = self._encode(event, self._numbered)
        self._numbered += 1
        return frame

    async def _append(self, frames: tuple[bytes, ...], end_ttl: float | None) -> None:
        first = self._appended
        self._appended += len(frames)
        if self._failed:
            return
        try:
            await self._events.append(self._id, first, frames, end_ttl=end_ttl)
        except (StoreUnavailable, trio.ClosedResourceError):
            self._failed = True  # later frames would leave a gap: none is appended
            log.warning("the event log of background response %s stopped", self._id)


def terminal_frame(encode: FrameEncoder, record: ResponseRecord, sequence_number: int) -> bytes:
    """The terminal frame of a finished `record`, for a log whose job could not end it
    (its process stopped first): numbered after the log's last frame."""
    return encode(ResponseFinished(record), sequence_number)
