"""`GET /v1/responses/{id}?stream=true[&starting_after=N]`: a background response's
events again, from its event log (`store/event_log.py`), then live until the end.

The frames are the log's bytes, sent as they were written: the same sequence numbers,
ids and indexes on every read, whichever replica serves it. A reader follows the log,
never the job: it holds no slot, no job and no store connection between reads, so any
number of resumers of one response cost the job nothing, and one that stops reading
holds only its own connection. The frames carry no `obfuscation` padding (this server
never adds any): `include_obfuscation` is accepted, and a replay stays byte-identical.
"""

from __future__ import annotations

import trio
from quart import Response, request

from mlxcel.actors.job_events import terminal_frame
from mlxcel.errors import InvalidRequest, NotFound, StoreUnavailable
from mlxcel.http.handles import Handles
from mlxcel.http.sse import KEEPALIVE_FRAME, numbered_frame, sse_frame
from mlxcel.items import ResponseRecord
from mlxcel.store import EventLog, LogSlice

READ_FRAMES = 256
"""Frames read from the log at once: what one reader holds at most."""
WAIT_SECS = 1.0
"""The longest wait on the log before it is read again."""
STALE_SECS = 2.0
"""A log that did not grow this long while its response is stored as ended was left
unended by its job's process: the reader ends it with the stored object."""
MAX_NUMBER = 2**50
"""`starting_after` above this is beyond any log (the stores count in doubles)."""


def wants_stream() -> bool:
    """Whether the query asks for the events (`stream=true`); 400 for a value that is
    neither true nor false."""
    value = request.args.get("stream")
    if value is None or value.lower() == "false":
        return False
    if value.lower() == "true":
        return True
    raise _invalid("stream", f"Invalid 'stream': {value[:64]!r}. Expected true or false.")


async def resume(h: Handles, record: ResponseRecord) -> Response:
    """The event stream of `record` (its tenant already checked) after `starting_after`."""
    if not record.background:
        raise _invalid(
            "stream",
            f"Response '{record.id}' was not created with 'background': true; only a "
            "background response's events can be streamed again.",
        )
    after = _starting_after()
    _obfuscation()
    events = h.store.events
    first = None if events is None else await events.read(record.id, after, READ_FRAMES)
    if events is None or first is None:
        raise NotFound(
            f"The events of response '{record.id}' are no longer kept.", code="not_found"
        )
    if first.truncated:
        raise InvalidRequest(
            f"The event log of response '{record.id}' passed its bounds "
            "(--max-events-per-response or the store's byte budget) and was not kept; "
            "retrieve the response without 'stream'.",
            param="stream",
            code="event_log_truncated",
        )
    if after >= first.count:
        raise _invalid(
            "starting_after",
            f"'starting_after' {after} is beyond the last event ({first.count - 1}) of "
            f"response '{record.id}'.",
        )
    h.metrics.resumes.inc()
    body = ResumeBody(h, events, record.id, after, first)
    return Response(
        body,
        content_type="text/event-stream",
        headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
    )


class ResumeBody:
    """The log's frames after `after`, then its new ones as they come, until the
    terminal frame; an SSE comment for each quiet keep-alive interval."""

    def __init__(
        self, h: Handles, events: EventLog, response_id: str, after: int, first: LogSlice
    ) -> None:
        self._h = h
        self._events = events
        self._id = response_id
        self._after = after
        self._slice: LogSlice | None = first
        self._grew_at = trio.current_time()
        """When the log last grew (or the read began)."""
        self._done = False

    def __aiter__(self) -> ResumeBody:
        return self

    async def __anext__(self) -> bytes:
        try:
            return await self._next()
        except StoreUnavailable:
            return self._error("store_unavailable", "The store stopped answering; resume later.")

    async def _next(self) -> bytes:
        quiet_since = trio.current_time()
        while not self._done:
            found = self._slice or await self._read()
            self._slice = None
            if found is None:
                break  # dropped for room: nothing more to send
            if found.truncated:
                return self._error("event_log_truncated", "The event log passed its bounds.")
            now = trio.current_time()
            if found.frames:
                self._grew_at = now
                self._after += len(found.frames)
                self._done = found.ended and self._after >= found.count - 1
                return b"".join(found.frames)
            if found.ended:
                break
            if now - self._grew_at >= STALE_SECS:
                self._grew_at = now
                await self._end_if_stale(found.count)
                continue
            if now - quiet_since >= self._h.keepalive_secs:
                return KEEPALIVE_FRAME
            with trio.move_on_after(WAIT_SECS):
                await self._events.wait(self._id, self._after)
        raise StopAsyncIteration

    async def _read(self) -> LogSlice | None:
        return await self._events.read(self._id, self._after, READ_FRAMES)

    def _error(self, code: str, message: str) -> bytes:
        """The `error` event that ends a stream cut short (unnumbered: not of the log);
        the SDKs raise it, and the client resumes after the last event it saw."""
        self._done = True
        return sse_frame({"type": "error", "code": code, "message": message, "param": None})

    async def _end_if_stale(self, count: int) -> None:
        """End the log with the stored object when its job's process stopped before it
        could (the store ended the job): numbered after the log's last frame, once (an
        append the job made first wins)."""
        record = await self._h.store.get(self._id)
        if record is None:
            self._done = True  # gone: nothing will come
        elif record.status not in ("queued", "in_progress"):
            frame = terminal_frame(numbered_frame, record, count)
            await self._events.append(
                self._id, count, (frame,), end_ttl=self._events.limits.ttl_for(record)
            )


def _starting_after() -> int:
    raw = request.args.get("starting_after")
    if raw is None:
        return -1
    digits = raw.strip()
    if not (digits.isascii() and digits.isdigit()):
        raise _invalid(
            "starting_after",
            f"Invalid 'starting_after': {raw[:64]!r}. Expected a sequence number (an "
            "integer of 0 or more).",
        )
    return MAX_NUMBER if len(digits) > 16 else min(int(digits), MAX_NUMBER)


def _obfuscation() -> None:
    value = request.args.get("include_obfuscation")
    if value is not None and value.lower() not in ("true", "false"):
        raise _invalid(
            "include_obfuscation",
            f"Invalid 'include_obfuscation': {value[:64]!r}. Expected true or false.",
        )


def _invalid(param: str, message: str) -> InvalidRequest:
    return InvalidRequest(message, param=param, code="invalid_value")
