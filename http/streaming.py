"""The body of a streamed response: a pipe from one response's events to SSE frames,
as Responses events (`EventStreamBody`) or as Chat Completions' bare `data:` chunks
ending with `data: [DONE]` (`DataStreamBody`).

The response stream must be closed however the exchange ends, or its slot would wait
on a reader that will never come. Quart closes a body it has entered; but a client
that hangs up between the route's return and the first byte cancels the exchange
before Quart enters the body. So the stream is also bound to the exchange's own task
group: a guard task there closes it when the exchange ends, whichever way.
"""

from __future__ import annotations

import json
import logging
from collections import deque
from collections.abc import Callable
from typing import Any

import trio

from mlxcel.actors.response_stream import ResponseStream
from mlxcel.http.access_log import ExchangeNote
from mlxcel.http.sse import KEEPALIVE_FRAME, SseEncoder
from mlxcel.respond.events import KeepAlive, ResponseCreated, ResponseEvent, ResponseFinished

log = logging.getLogger(__name__)


class EventStreamBody:
    """`response.created` at once (even while queued), then the slot's events; while the
    response waits in the line, a keep-alive with its place for each quiet interval (a
    running one gets its keep-alives from its slot)."""

    def __init__(
        self,
        created: ResponseCreated,
        events: ResponseStream,
        *,
        keepalive_secs: float,
        progress: bool,
        note: ExchangeNote | None = None,
    ) -> None:
        self._created: ResponseCreated | None = created
        self._note = note
        self._events = events
        self._keepalive = keepalive_secs
        self._encoder = SseEncoder(progress=progress)

    def __aiter__(self) -> EventStreamBody:
        return self

    async def __anext__(self) -> bytes:
        if self._created is not None:
            event, self._created = self._created, None
            return self._encode(event)
        while True:
            with trio.move_on_after(self._keepalive):
                next_event = await self._events.__anext__()
                _note_end(self._note, next_event)
                return self._encode(next_event)
            position = await self._events.queue_position()
            if position is not None:
                tokens = self._events.prompt_tokens
                return self._encode(KeepAlive(self._events.response_id, position, 0, tokens))

    def _encode(self, event: ResponseEvent) -> bytes:
        try:
            return self._encoder.encode(event)
        except Exception:
            # An event that cannot be encoded ends this stream alone.
            log.exception("stream %s: an event could not be encoded", self._events.response_id)
            raise StopAsyncIteration from None

    async def aclose(self) -> None:
        await self._events.aclose()


Translate = Callable[[ResponseEvent], list[dict[str, Any]]]

DONE = b"data: [DONE]\n\n"


class DataStreamBody:
    """`first` at once (even while queued), then each event as the chunks `translate`
    makes of it, one `data:` frame each, and `data: [DONE]` at the end. Keep-alives are
    SSE comments (Chat Completions clients know no progress event), also while the
    response waits in the line."""

    def __init__(
        self,
        first: list[dict[str, Any]],
        events: ResponseStream,
        translate: Translate,
        *,
        keepalive_secs: float,
        note: ExchangeNote | None = None,
    ) -> None:
        self._note = note
        # Bounded by what one event makes (a chunk or two), taken before the next is read.
        self._frames = deque(_frame(chunk) for chunk in first)
        self._events = events
        self._translate = translate
        self._keepalive = keepalive_secs
        self._done = False

    def __aiter__(self) -> DataStreamBody:
        return self

    async def __anext__(self) -> bytes:
        while not self._frames:
            if self._done:
                raise StopAsyncIteration
            with trio.move_on_after(self._keepalive) as quiet:
                try:
                    event = await self._events.__anext__()
                except StopAsyncIteration:
                    self._done = True
                    self._frames.append(DONE)
                    continue
            if quiet.cancelled_caught or isinstance(event, KeepAlive):
                return KEEPALIVE_FRAME
            _note_end(self._note, event)
            self._frames.extend(self._encode(event))
        return self._frames.popleft()

    def _encode(self, event: ResponseEvent) -> list[bytes]:
        try:
            return [_frame(chunk) for chunk in self._translate(event)]
        except Exception:
            # An event that cannot be encoded ends this stream alone.
            log.exception("stream %s: an event could not be encoded", self._events.response_id)
            raise StopAsyncIteration from None

    async def aclose(self) -> None:
        await self._events.aclose()


def _note_end(note: ExchangeNote | None, event: ResponseEvent) -> None:
    """A stream's usage is known at its end: tell the access log."""
    if note is not None and isinstance(event, ResponseFinished):
        note.response(event.record.id, event.record.usage)


def _frame(chunk: dict[str, Any]) -> bytes:
    return b"data: " + json.dumps(chunk, allow_nan=False).encode() + b"\n\n"


def bind_to_exchange(events: ResponseStream) -> None:
    """Close `events` when the current HTTP exchange ends, whether or not its body ran."""
    exchange = trio.lowlevel.current_task().parent_nursery
    if exchange is not None:
        exchange.start_soon(_close_at_end, events)


async def _close_at_end(events: ResponseStream) -> None:
    try:
        await trio.sleep_forever()
    finally:
        await events.aclose()  # shielded inside; idempotent
