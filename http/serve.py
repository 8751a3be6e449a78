"""Hypercorn serving the routes inside the root nursery, with a cap on open connections.

Hypercorn has no connection cap, so this module runs the accept loop itself and hands
each connection to hypercorn's own connection handler (`TCPServer`), as hypercorn's
`worker_serve` does; everything past the accept is hypercorn's. At the cap the loop stops
accepting, so further connections wait in the kernel's listen backlog until one closes.
"""

from __future__ import annotations

import contextlib
import errno
import functools
import logging
import socket
from collections.abc import Awaitable, Callable
from typing import Any

import h11
import trio
from hypercorn.config import Config
from hypercorn.protocol.h11 import H11Protocol
from hypercorn.trio.lifespan import Lifespan
from hypercorn.trio.tcp_server import TCPServer
from hypercorn.trio.worker_context import WorkerContext
from hypercorn.typing import LifespanState
from hypercorn.utils import repr_socket_addr, wrap_app
from quart_trio import QuartTrio

from mlxcel.http.body import MAX_BODY_BYTES

log = logging.getLogger(__name__)

# Agents and benchmarks open hundreds of connections at once; a short listen backlog
# would make the kernel drop the rest. The kernel caps it at somaxconn.
BACKLOG = 2048
ACCEPT_RETRY_SECS = 0.1
LINGER_SECS = 2.0
"""How long a connection closed with its request body still arriving keeps reading (and
dropping) it, so the client, still sending, can read the answer."""
_EXHAUSTED = frozenset({errno.EMFILE, errno.ENFILE, errno.ENOMEM, errno.ENOBUFS})


async def serve_http(
    app: QuartTrio,
    host: str,
    port: int,
    *,
    max_connections: int,
    header_timeout: float,
    shutdown_trigger: Callable[[], Awaitable[None]] = trio.sleep_forever,
    graceful_timeout: float,
    task_status: trio.TaskStatus[list[str]] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Serve until cancelled, or until `shutdown_trigger` returns and the open connections
    have closed (at most `graceful_timeout` later); reports the bound URLs (port 0 picks
    a free one).

    A connection must send a request's headers within `header_timeout` of opening or of
    its previous response (an idle keep-alive connection closes after it too); a slow
    body is the route's to time out. At most `max_connections` are open at once.
    """
    config = Config()
    config.accesslog = None
    config.errorlog = "-"
    config.graceful_timeout = graceful_timeout
    # Hypercorn's idle timer runs from the connection's start (or its last response)
    # until a request's headers are complete: it is the header timeout.
    config.keep_alive_timeout = header_timeout
    # A WebSocket message is a request body: the same limit (beyond it, close 1009).
    config.websocket_max_message_size = MAX_BODY_BYTES
    asgi = wrap_app(app, config.wsgi_max_body_size, "asgi")
    state: LifespanState = {}
    lifespan = Lifespan(asgi, config, state)
    context = WorkerContext(None)
    async with trio.open_nursery() as lifespan_nursery:
        await lifespan_nursery.start(lifespan.handle_lifespan)
        await lifespan.wait_for_startup()
        listeners = await trio.open_tcp_listeners(port, host=host, backlog=BACKLOG)
        limiter = trio.CapacityLimiter(max_connections)
        handler = functools.partial(_Connection, asgi, config, context, state)
        async with trio.open_nursery() as connections:
            try:
                async with trio.open_nursery() as accepting:
                    for listener in listeners:
                        accepting.start_soon(_accept, listener, limiter, handler, connections)
                    task_status.started([_url(listener) for listener in listeners])
                    await shutdown_trigger()
                    accepting.cancel_scope.cancel()
            finally:  # new connections are refused from here on
                for listener in listeners:
                    await trio.aclose_forcefully(listener)
            # Idle connections close now and busy ones once their response is out.
            await context.terminated.set()
            connections.cancel_scope.deadline = trio.current_time() + graceful_timeout
        await lifespan.wait_for_shutdown()
        lifespan_nursery.cancel_scope.cancel()


class _Connection(TCPServer):
    """Hypercorn's connection handler, closing a connection the way clients can read.

    A client that sends its whole body before it reads (most do) would find the
    connection reset and the answer lost if it were closed with the body still arriving
    (an early 413 or 404): so such a close sends its end of the stream first and lingers,
    dropping what still comes, until the client closes or `LINGER_SECS` pass. The close
    is shielded, as it may run in a task being cancelled (see `http/exchange.py`), and a
    connection whose client has gone ends at once, not when its idle timer fires."""

    def __init__(self, *args: Any) -> None:
        super().__init__(*args)
        self._reader_done = trio.Event()

    async def _read_data(self) -> None:
        try:
            await super()._read_data()
        finally:
            self._reader_done.set()
            # The client is gone: without this, the idle timer would hold the
            # connection (and its place under the cap) until it fired.
            await self.idle_task.stop()

    async def _close(self) -> None:
        with trio.CancelScope(shield=True):
            if self._body_unfinished():
                with contextlib.suppress(trio.BrokenResourceError, trio.ClosedResourceError):
                    await self.stream.send_eof()
                with trio.move_on_after(LINGER_SECS):
                    await self._reader_done.wait()
            await super()._close()

    def _body_unfinished(self) -> bool:
        protocol = getattr(self, "protocol", None)
        http1 = getattr(protocol, "protocol", None)
        return isinstance(http1, H11Protocol) and http1.connection.their_state is h11.SEND_BODY


async def _accept(
    listener: trio.SocketListener,
    limiter: trio.CapacityLimiter,
    handler: Callable[[trio.SocketStream], Awaitable[None]],
    connections: trio.Nursery,
) -> None:
    while True:
        slot = object()
        await limiter.acquire_on_behalf_of(slot)
        try:
            stream = await listener.accept()
        except OSError as exc:
            limiter.release_on_behalf_of(slot)
            if exc.errno not in _EXHAUSTED:
                raise
            # Out of descriptors or memory: the open connections will free some.
            log.error("cannot accept a connection (%s); retrying shortly", exc)
            await trio.sleep(ACCEPT_RETRY_SECS)
        except BaseException:
            limiter.release_on_behalf_of(slot)
            raise
        else:
            connections.start_soon(_serve_connection, handler, stream, limiter, slot)


async def _serve_connection(
    handler: Callable[[trio.SocketStream], Awaitable[None]],
    stream: trio.SocketStream,
    limiter: trio.CapacityLimiter,
    slot: object,
) -> None:
    try:
        await handler(stream)
    finally:
        limiter.release_on_behalf_of(slot)
        await trio.aclose_forcefully(stream)


def _url(listener: trio.SocketListener) -> str:
    sock = listener.socket
    family = socket.AF_INET6 if sock.family == socket.AF_INET6 else socket.AF_INET
    return f"http://{repr_socket_addr(family, sock.getsockname())}"
