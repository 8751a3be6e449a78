"""The body of a streamed response: a pipe from one response's events to SSE frames,
as Responses events (`EventStreamBody`), or translated into another wire format's chunks
(`DataStreamBody`): Chat Completions' bare `data:` chunks ending with `data: [DONE]`, or
Anthropic's named events (`http/messages_stream.py`).

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
from dataclasses import dataclass
from typing import Any, Protocol

import trio
from quart import Response

from mlxcel.actors.response_stream import ResponseStream
from mlxcel.fleet import ModelLease
from mlxcel.generation import GenerationRequest
from mlxcel.http.access_log import ExchangeNote, exchange_note, note_record
from mlxcel.http.exchange import exchange_nursery
from mlxcel.http.handles import Handles
from mlxcel.http.sse import KEEPALIVE_FRAME, SseEncoder
from mlxcel.respond.events import (
    KeepAlive,
    PromptRead,
    ResponseCreated,
    ResponseEvent,
    ResponseFinished,
)

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
        encoder: SseEncoder | None = None,
    ) -> None:
        """`encoder`: one that numbered frames before these (a model's load)."""
        self._created: ResponseCreated | None = created
        self._note = note
        self._events = events
        self._keepalive = keepalive_secs
        self._encoder = encoder or SseEncoder(progress=progress)

    def __aiter__(self) -> EventStreamBody:
        return self

    async def __anext__(self) -> bytes:
        if self._created is not None:
            event, self._created = self._created, None
            return self._encode(event)
        while True:
            with trio.move_on_after(self._keepalive):
                next_event = await self._events.__anext__()
                if isinstance(next_event, PromptRead):
                    continue  # no Responses frame shows it (its usage does, at the end)
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


class EventSource(Protocol):
    """What a translated stream reads: one response's events (`ResponseStream`), or
    several read as one (`http/choices.py`)."""

    @property
    def response_id(self) -> str: ...

    async def __anext__(self) -> ResponseEvent: ...

    async def aclose(self) -> None: ...


DONE = b"data: [DONE]\n\n"


@dataclass(frozen=True, slots=True)
class Framing:
    """How a translated stream is written: each chunk's frame, the keep-alive frame, and
    the frame that ends the stream (None: none)."""

    frame: Callable[[dict[str, Any]], bytes]
    keepalive: bytes
    end: bytes | None


def _frame(chunk: dict[str, Any]) -> bytes:
    return b"data: " + json.dumps(chunk, allow_nan=False).encode() + b"\n\n"


DATA_FRAMES = Framing(_frame, KEEPALIVE_FRAME, DONE)
"""Chat Completions' stream: SSE comments keep it alive (its clients know no progress
event), `data: [DONE]` ends it."""


class DataStreamBody:
    """`first` at once (even while queued), then each event as the chunks `translate`
    makes of it, one frame each, and the framing's end. A quiet interval sends the
    framing's keep-alive, also while the response waits in the line."""

    def __init__(
        self,
        first: list[dict[str, Any]],
        events: EventSource,
        translate: Translate,
        *,
        keepalive_secs: float,
        note: ExchangeNote | None = None,
        framing: Framing = DATA_FRAMES,
    ) -> None:
        self._note = note
        self._framing = framing
        # Bounded by what one event makes (a chunk or two), taken before the next is read.
        self._frames = deque(framing.frame(chunk) for chunk in first)
        self._events = events
        self._translate = translate
        self._keepalive = keepalive_secs
        self._done = False
        self._opened = False
        """A frame was sent: the framing's own keep-alive may follow."""

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
                    if self._framing.end is not None:
                        self._frames.append(self._framing.end)
                    continue
            if quiet.cancelled_caught or isinstance(event, KeepAlive):
                # Before the first event an SSE comment: a stream's event flow opens with
                # its first event (Anthropic's `message_start`), never a `ping`.
                return self._framing.keepalive if self._opened else KEEPALIVE_FRAME
            _note_end(self._note, event)
            self._frames.extend(self._encode(event))
        self._opened = True
        return self._frames.popleft()

    def _encode(self, event: ResponseEvent) -> list[bytes]:
        try:
            return [self._framing.frame(chunk) for chunk in self._translate(event)]
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


async def translated_response(
    h: Handles,
    lease: ModelLease,
    generation: GenerationRequest,
    first: list[dict[str, Any]],
    translate: Translate,
    framing: Framing = DATA_FRAMES,
) -> Response:
    """The streamed answer of `generation` in another wire format: submitted now to the
    model `lease` holds (503, or the format's overloaded answer, when the line is full)
    and bound to the exchange."""
    stream = await submitted_stream(lease, generation)
    return data_stream_response(h, stream, first, translate, framing)


async def submitted_stream(lease: ModelLease, generation: GenerationRequest) -> ResponseStream:
    """`generation`'s stream on the model `lease` holds, submitted (503 when the line is
    full) and closed when the HTTP exchange ends (it holds the lease until then); its
    usage reaches the access log when it ends."""
    stream = lease.stream(generation)
    bind_to_exchange(stream)
    await submit_stream(stream, generation)
    return stream


async def submit_stream(stream: ResponseStream, generation: GenerationRequest) -> None:
    """Submit `generation` on its `stream` (503 when the line is full), noted for the
    access log. The caller closes the stream (a WebSocket owns its own, per response)."""
    note_record(generation.record)
    await stream.submit()


def data_stream_response(
    h: Handles,
    events: EventSource,
    first: list[dict[str, Any]],
    translate: Translate,
    framing: Framing = DATA_FRAMES,
) -> Response:
    """The `text/event-stream` answer that writes `first`, then `events` translated."""
    body = DataStreamBody(
        first,
        events,
        translate,
        keepalive_secs=h.keepalive_secs,
        note=exchange_note(),
        framing=framing,
    )
    return Response(
        body,
        content_type="text/event-stream",
        headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
    )


def bind_to_exchange(events: ResponseStream) -> None:
    """Close `events` when the current HTTP exchange ends, whether or not its body ran."""
    exchange_nursery().start_soon(_close_at_end, events)


async def _close_at_end(events: ResponseStream) -> None:
    try:
        await trio.sleep_forever()
    finally:
        await events.aclose()  # shielded inside; idempotent
