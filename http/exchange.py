"""Each HTTP exchange at the ASGI edge, kept whole under Quart-Trio's cancellation.

Quart-Trio runs an exchange as two tasks: one receives the request's ASGI messages, the
other sends the response, and whichever ends first cancels the other. Hypercorn does
part of its connection bookkeeping inside `send`: ending the exchange, then recycling
the keep-alive connection for the next request or closing it. Ending the exchange hands
the receiving task a disconnect, and its cancel used to land in the middle of that
bookkeeping whenever the answer went out before the request body had arrived (any early
answer: a 401, a 404, a refusal): the connection was then neither recycled nor closed,
and the client's next request on it waited forever.

So `send` is shielded (hypercorn shields its socket writes already; the rest is quick),
and an answer sent before the request body has been received says `Connection: close`,
because hypercorn ends that connection after it.
"""

from __future__ import annotations

from typing import cast

import trio
from hypercorn.typing import (
    ASGIReceiveCallable,
    ASGIReceiveEvent,
    ASGISendCallable,
    ASGISendEvent,
    Scope,
)
from quart_trio import QuartTrio


class App(QuartTrio):
    """The Quart-Trio app, with each HTTP exchange's sends kept whole."""

    async def asgi_app(
        self, scope: Scope, receive: ASGIReceiveCallable, send: ASGISendCallable
    ) -> None:
        if scope["type"] != "http":
            await super().asgi_app(scope, receive, send)
            return
        exchange = _Exchange(receive, send)
        await super().asgi_app(scope, exchange.receive, exchange.send)


class _Exchange:
    def __init__(self, receive: ASGIReceiveCallable, send: ASGISendCallable) -> None:
        self._receive = receive
        self._send = send
        self._request_received = False

    async def receive(self) -> ASGIReceiveEvent:
        message = await self._receive()
        if message["type"] == "http.disconnect" or not message.get("more_body", False):
            self._request_received = True
        return message

    async def send(self, message: ASGISendEvent) -> None:
        if message["type"] == "http.response.start" and not self._request_received:
            headers = [*message.get("headers", ()), (b"connection", b"close")]
            message = cast(ASGISendEvent, {**message, "headers": headers})
        with trio.CancelScope(shield=True):
            await self._send(message)
