"""A streamed response whose model is not loaded yet: the stream opens at once and has an
`mlx.progress` event each quiet interval while the model loads (clients such as Codex
CLI give up on a stream without data events), then the response's own events follow,
numbered on. A load that fails, or a request refused once the model is there (its 400s,
a full line), ends the stream with one `error` event: the 200 has been sent."""

from __future__ import annotations

import logging
from collections.abc import AsyncGenerator, AsyncIterator, Callable
from contextlib import aclosing
from typing import cast

import trio
from quart import stream_with_context

from mlxcel.errors import MlxcelError
from mlxcel.fleet import ModelLease
from mlxcel.http.handles import handles
from mlxcel.http.sse import SseEncoder
from mlxcel.respond.events import KeepAlive, StreamError

log = logging.getLogger(__name__)

Then = Callable[[ModelLease, SseEncoder], AsyncGenerator[bytes]]
"""What the stream sends once the model is loaded, given its lease and the frames'
encoder."""


def loading_body(key: str, then: Then) -> AsyncIterator[bytes]:
    """The frames of a stream that waits for model `key` to load, then runs `then`
    (in the request's context, so it prepares as the route would) under the request's
    one lease, held until the stream ends (its response shares it)."""
    h = handles()
    encoder = SseEncoder(progress=h.progress_events)

    async def frames() -> AsyncIterator[bytes]:
        fleet = handles().fleet
        lease: ModelLease | None = None
        try:
            while lease is None:
                with trio.move_on_after(h.keepalive_secs):
                    lease = await fleet.take(key)
                if lease is None:
                    yield encoder.encode(KeepAlive(""))  # still loading
        except MlxcelError as exc:
            yield _error(encoder, exc)
            return
        async with lease:
            body = then(lease, encoder)
            try:
                first = await anext(body)
            except StopAsyncIteration:
                return
            except MlxcelError as exc:
                yield _error(encoder, exc)
                return
            yield first
            async with aclosing(body):
                async for frame in body:
                    yield frame

    # In the request's context, as the route is (its tenant, its key's admission).
    in_context = cast(Callable[[], AsyncIterator[bytes]], stream_with_context(frames))
    return in_context()


def _error(encoder: SseEncoder, exc: MlxcelError) -> bytes:
    """The one `error` event of a stream whose 200 has been sent."""
    return encoder.encode(StreamError("", exc.code or "server_error", exc.message))
