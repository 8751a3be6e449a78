"""The body of a streamed response: a pipe from one response's events to SSE frames.

The response stream must be closed however the exchange ends, or its slot would wait
on a reader that will never come. Quart closes a body it has entered; but a client
that hangs up between the route's return and the first byte cancels the exchange
before Quart enters the body. So the stream is also bound to the exchange's own task
group: a guard task there closes it when the exchange ends, whichever way.
"""

from __future__ import annotations

import logging

import trio

from mlxcel.actors.messages import KeepAlive, ResponseCreated, ResponseEvent
from mlxcel.actors.response_stream import ResponseStream
from mlxcel.http.sse import SseEncoder

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
    ) -> None:
        self._created: ResponseCreated | None = created
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
                return self._encode(await self._events.__anext__())
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
