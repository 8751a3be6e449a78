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
and an answer sent while a declared request body (`Content-Length` above 0, or
`Transfer-Encoding`) is still unread says `Connection: close`, because hypercorn ends that
connection after it. A request without a body keeps its connection whatever the app read
(a quick `GET` is answered on a connection the client may use again), and one that
declares its body both ways (`Transfer-Encoding` and `Content-Length`, RFC 9112 §6.3: a
request smuggler's) is answered and its connection closed.

Every exchange is counted here, once it is over (a stream's whole body sent): by the URL
rule it matched (put in its scope by a hook of the app), its method and its status, so
any route, whenever it was added, is counted; and it gets its access-log line
(`http/access_log.py`).

The browser policy (`http/browser.py`) is applied here too, before the app sees the
request: a `Host` a loopback-bound server must not answer is refused with 403, a CORS
preflight is answered, and an answer to a listed origin gets its CORS headers.
"""

from __future__ import annotations

import json
from typing import cast

import trio
from hypercorn.typing import (
    ASGIReceiveCallable,
    ASGIReceiveEvent,
    ASGISendCallable,
    ASGISendEvent,
    HTTPScope,
    Scope,
)
from quart_trio import QuartTrio

from mlxcel.http.access_log import NOTE_KEY, ExchangeNote, log_exchange
from mlxcel.http.browser import BrowserPolicy, Headers
from mlxcel.http.errors import error_body
from mlxcel.metrics import Metrics

ROUTE_KEY = "mlxcel.route"
"""The scope key of the URL rule an exchange matched."""


def exchange_nursery() -> trio.Nursery:
    """The nursery of the HTTP exchange the calling route runs in: work started there
    (reading a response's streams, closing them at the exchange's end) ends with the
    exchange, whether or not its body ran. quart-trio runs each request's handler as a
    task of that nursery (the range pinned in `pyproject.toml`); this is the one place
    the server reaches for it."""
    nursery = trio.lowlevel.current_task().parent_nursery
    if nursery is None:
        raise RuntimeError("not called from an HTTP exchange's handler")
    return nursery


class App(QuartTrio):
    """The Quart-Trio app, with each HTTP exchange's sends kept whole and counted."""

    metrics: Metrics | None = None
    access_log: bool = False
    browser: BrowserPolicy = BrowserPolicy()

    async def asgi_app(
        self, scope: Scope, receive: ASGIReceiveCallable, send: ASGISendCallable
    ) -> None:
        if scope["type"] == "websocket" and not self.browser.socket_allowed(scope):
            await receive()  # its `websocket.connect`; the close before accepting is a 403
            await send({"type": "websocket.close", "code": 1008, "reason": ""})
            return
        if scope["type"] != "http":
            await super().asgi_app(scope, receive, send)
            return
        exchange = _Exchange(receive, send, _body_framing(scope))
        cast(dict[str, object], scope)[NOTE_KEY] = ExchangeNote()
        started = trio.current_time()
        try:
            if not self.browser.host_allowed(scope):
                await _answer(exchange, 403, _HOST_REFUSED)
            elif self.browser.is_preflight(scope):
                await exchange.receive()  # its empty body: the connection stays open
                await _answer(exchange, 204, None, self.browser.preflight_headers(scope))
            else:
                exchange.extra_headers = self.browser.response_headers(scope)
                await super().asgi_app(scope, exchange.receive, exchange.send)
        finally:
            if self.access_log:
                log_exchange(scope, exchange.status, trio.current_time() - started)
            if self.metrics is not None:
                route = cast(dict[str, object], scope).get(ROUTE_KEY)
                self.metrics.observe_request(
                    route if isinstance(route, str) else None,
                    scope["method"],
                    exchange.status,
                    trio.current_time() - started,
                )


_HOST_REFUSED = json.dumps(
    error_body(
        "This server answers only requests addressed to localhost, 127.0.0.1 or [::1] "
        "(it is bound to a loopback address).",
        "invalid_request_error",
        code="host_not_allowed",
    )
).encode()


async def _answer(
    exchange: _Exchange, status: int, body: bytes | None, headers: Headers | None = None
) -> None:
    """An answer given at the edge, without the app (a refused Host, a preflight)."""
    head = list(headers or ())
    if body is not None:
        head += [(b"content-type", b"application/json"), (b"content-length", b"%d" % len(body))]
    await exchange.send({"type": "http.response.start", "status": status, "headers": head})
    await exchange.send({"type": "http.response.body", "body": body or b"", "more_body": False})


def _body_framing(scope: Scope) -> tuple[bool, bool]:
    """Whether the request declares a body, and whether it declares it both ways."""
    names = {name.lower(): value for name, value in cast(HTTPScope, scope)["headers"]}
    chunked = b"transfer-encoding" in names
    length = names.get(b"content-length", b"0").strip()
    return chunked or length not in (b"", b"0"), chunked and b"content-length" in names


class _Exchange:
    def __init__(
        self,
        receive: ASGIReceiveCallable,
        send: ASGISendCallable,
        framing: tuple[bool, bool] = (True, False),
    ) -> None:
        self._receive = receive
        self._send = send
        self.extra_headers: Headers = []
        """Headers the answer carries besides its own (CORS)."""
        has_body, self._ambiguous = framing
        self._request_received = not has_body
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
            headers = [*message.get("headers", ()), *self.extra_headers]
            if not self._request_received or self._ambiguous:
                headers.append((b"connection", b"close"))
            message = cast(ASGISendEvent, {**message, "headers": headers})
        with trio.CancelScope(shield=True):
            await self._send(message)
