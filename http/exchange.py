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

Every exchange is counted here, once it is over (a stream's whole body sent): by the URL
rule it matched (put in its scope by a hook of the app), its method and its status, so
any route, whenever it was added, is counted.
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

from mlxcel.metrics import Metrics

ROUTE_KEY = "mlxcel.route"
"""The scope key of the URL rule an exchange matched."""


class App(QuartTrio):
    """The Quart-Trio app, with each HTTP exchange's sends kept whole and counted."""

    metrics: Metrics | None = None

    async def asgi_app(
        self, scope: Scope, receive: ASGIReceiveCallable, send: ASGISendCallable
    ) -> None:
        if scope["type"] != "http":
            await super().asgi_app(scope, receive, send)
            return
        exchange = _Exchange(receive, send)
        started = trio.current_time()
        try:
            await super().asgi_app(scope, exchange.receive, exchange.send)
        finally:
            if self.metrics is not None:
                route = cast(dict[str, object], scope).get(ROUTE_KEY)
                self.metrics.observe_request(
                    route if isinstance(route, str) else None,
                    scope["method"],
                    exchange.status,
                    trio.current_time() - started,
                )


class _Exchange:
    def __init__(self, receive: ASGIReceiveCallable, send: ASGISendCallable) -> None:
        self._receive = receive
        self._send = send
        self._request_received = False
        self.status: int | None = None
        """The answer's status, once it has started."""

    async def receive(self) -> ASGIReceiveEvent:
        message = await self._receive()
        if message["type"] == "http.disconnect" or not message.get("more_body", False):
            self._request_received = True
        return message

    async def send(self, message: ASGISendEvent) -> None:
        if message["type"] == "http.response.start":
            self.status = message["status"]
        if message["type"] == "http.response.start" and not self._request_received:
            headers = [*message.get("headers", ()), (b"connection", b"close")]
            message = cast(ASGISendEvent, {**message, "headers": headers})
        with trio.CancelScope(shield=True):
            await self._send(message)
