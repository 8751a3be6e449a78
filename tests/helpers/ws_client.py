"""A WebSocket client for tests of `/v1/responses` in WebSocket mode: the `websockets`
package's blocking client, each call run off the Trio thread that serves the app."""

from __future__ import annotations

import json
from typing import Any

from websockets.exceptions import ConnectionClosed
from websockets.sync.client import ClientConnection, connect

from support import FakeServer, in_thread

RECEIVE_SECS = 20.0
"""How long a test waits for one event before it counts the server as hung."""


class Socket:
    """One open WebSocket on the server's `/v1/responses`."""

    def __init__(self, connection: ClientConnection) -> None:
        self.connection = connection

    async def send(self, message: dict[str, Any] | str | bytes) -> None:
        data = json.dumps(message) if isinstance(message, dict) else message
        await in_thread(self.connection.send, data)

    async def create(self, **body: Any) -> None:
        """Send one `response.create` (the fake model unless `body` names another)."""
        await self.send({"type": "response.create", "model": "fake-model", **body})

    async def receive(self) -> dict[str, Any]:
        """The next event, parsed (a text frame each)."""
        data = await in_thread(self.connection.recv, RECEIVE_SECS)
        assert isinstance(data, str), "events are text frames"
        event: dict[str, Any] = json.loads(data)
        return event

    async def until_end(self) -> list[dict[str, Any]]:
        """Every event up to the terminal one (a response's end or an error event)."""
        events = [await self.receive()]
        while events[-1]["type"] not in TERMINAL:
            events.append(await self.receive())
        return events

    async def closed(self) -> int | None:
        """Wait for the server to close the socket; its close code. Events still on the
        way are read and dropped."""
        try:
            while True:
                await in_thread(self.connection.recv, RECEIVE_SECS)
        except ConnectionClosed as exc:
            return exc.rcvd.code if exc.rcvd is not None else None

    async def aclose(self) -> None:
        await in_thread(self.connection.close)


TERMINAL = frozenset({"response.completed", "response.failed", "response.incomplete", "error"})


def socket_url(server: FakeServer) -> str:
    return server.url.replace("http://", "ws://", 1) + "/v1/responses"


async def open_socket(server: FakeServer, api_key: str | None = None) -> Socket:
    headers = {"Authorization": f"Bearer {api_key}"} if api_key is not None else {}
    connection = await in_thread(
        connect,
        socket_url(server),
        additional_headers=headers,
        open_timeout=RECEIVE_SECS,
        legacy=True,  # the connection outlives this call: each test closes its own
    )
    return Socket(connection)
