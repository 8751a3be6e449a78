"""`/v1/responses` in WebSocket mode: one socket, many responses, one at a time.

A client sends `response.create` messages (a create body with its `type`). Each is served
by the create route's own path (`opened_stream` in `http/responses.py`: the key's limits,
the model's lease, preparation, metering, the scheduler's line) and answered with the
events its SSE stream carries, one JSON text message each, ending with the terminal one.
An error is one `{"type": "error", "status", "error": {...}}` message with the status and
body HTTP would answer; the socket stays open. The key is checked once, at the upgrade:
a bad one gets that error message, then a close (1008).

Bounds: one response in flight per socket (another `response.create` meanwhile is an
error, not a queue); a message at most the HTTP body limit (hypercorn closes with 1009
beyond it); a socket that sends nothing with no response running is closed (1000) after
`--websocket-idle-secs`; hypercorn answers pings. Closing the socket cancels its response.

`store: false` responses are kept by their socket alone (`LocalResponses`), so the next
`response.create` may continue one with `previous_response_id` and only its new input; no
other socket finds them, and a create naming one that fails forgets it.
"""

from __future__ import annotations

import json
from collections import OrderedDict
from typing import Any, cast

import trio
from hypercorn.typing import HTTPScope
from quart import Blueprint, current_app, websocket

from mlxcel.errors import InvalidRequest, ShuttingDown, Unauthenticated
from mlxcel.http.access_log import NOTE_KEY, ExchangeNote, log_exchange
from mlxcel.http.body import model_from, parse_json
from mlxcel.http.errors import map_error
from mlxcel.http.exchange import App
from mlxcel.http.guards import check_api_key, exchange_scope
from mlxcel.http.handles import Handles, handles
from mlxcel.http.responses import opened_stream
from mlxcel.http.schemas import CreateResponseBody
from mlxcel.http.sse import SocketEncoder
from mlxcel.items import ResponseRecord
from mlxcel.prepare.offload import off_loop
from mlxcel.store.codec import encoded_size

responses_socket = Blueprint("responses_socket", __name__)

LOCAL_RESPONSES = 8
"""`store: false` responses a socket keeps: a client continues its last one; a few more
let it go back a turn or two."""
LOCAL_BYTES = 16 * 1024 * 1024
"""Their bytes (in the store's encoding): a socket's memory stays bounded whatever its
turns hold; one larger than this is not kept."""
CLOSE_NORMAL = 1000
CLOSE_POLICY = 1008


class LocalResponses:
    """A socket's own `store: false` responses, least recently used first out."""

    def __init__(self, max_entries: int = LOCAL_RESPONSES, max_bytes: int = LOCAL_BYTES) -> None:
        self.records: OrderedDict[str, ResponseRecord] = OrderedDict()
        self._sizes: dict[str, int] = {}
        self._max_entries = max_entries
        self._max_bytes = max_bytes

    def remember(self, record: ResponseRecord) -> None:
        size = encoded_size(record)
        if size > self._max_bytes:
            return
        self.records[record.id] = record
        self._sizes[record.id] = size
        while len(self.records) > self._max_entries or sum(self._sizes.values()) > self._max_bytes:
            oldest, _ = self.records.popitem(last=False)
            del self._sizes[oldest]

    def touch(self, response_id: str) -> None:
        if response_id in self.records:
            self.records.move_to_end(response_id)

    def forget(self, response_id: str) -> None:
        self.records.pop(response_id, None)
        self._sizes.pop(response_id, None)


@responses_socket.websocket("/responses")
async def serve_socket() -> None:
    """One client's socket, until it closes, goes idle or sends a bad key."""
    await websocket.accept()
    connection = _Connection(handles())
    if await connection.authenticated():
        await connection.run()


class _Connection:
    """A socket's state: its own responses, whether one runs, and one writer at a time."""

    def __init__(self, h: Handles) -> None:
        self._h = h
        self._local = LocalResponses()
        self._store = h.store.with_local(self._local.records)
        self._sending = trio.Lock()  # the response's events and a refusal may cross
        self._busy = False
        rule = websocket.url_rule
        self._route = rule.rule if rule is not None else None

    async def authenticated(self) -> bool:
        try:
            check_api_key(self._h.keyring)
        except Unauthenticated as exc:
            self._observe(await self._send_error(exc), 0.0)
            await websocket.close(CLOSE_POLICY, "invalid API key")
            return False
        return True

    async def run(self) -> None:
        """Read messages; each `response.create` runs in a task of the socket's own, so
        the socket's end (its handler cancelled) cancels it."""
        async with trio.open_nursery() as nursery:
            while (message := await self._next_message()) is not None:
                try:
                    body = await _create_body(message)
                    if self._busy:
                        raise InvalidRequest(
                            "A response is already in progress on this socket; send the "
                            "next 'response.create' after its terminal event.",
                            code="response_in_progress",
                        )
                except InvalidRequest as exc:
                    await self._send_error(exc)
                    continue
                self._busy = True
                nursery.start_soon(self._respond, body)
            await websocket.close(CLOSE_NORMAL, "idle")
            nursery.cancel_scope.cancel()

    async def _next_message(self) -> str | bytes | None:
        """The next message; None once the socket has been idle too long (never while a
        response runs)."""
        while True:
            with trio.move_on_after(self._h.websocket_idle_secs):
                message: str | bytes = await websocket.receive()
                return message
            if not self._busy:
                return None

    async def _respond(self, raw: dict[str, Any]) -> None:
        """One `response.create`, served as `POST /responses` serves a stream."""
        exchange_scope()[NOTE_KEY] = ExchangeNote()
        started = trio.current_time()
        named = raw.get("previous_response_id")
        named = named if isinstance(named, str) else None
        status = 200
        try:
            if self._h.stopping.is_set():
                raise ShuttingDown(
                    "The server is shutting down; retry on another server.",
                    code="server_shutting_down",
                )
            body = await model_from(CreateResponseBody, {**raw, "stream": True})
            if named is not None:
                self._local.touch(named)
            finished = await self._stream(body)
            if finished is not None:
                self._keep(finished, named)
        except Exception as exc:  # answered as HTTP would; Cancelled is not an Exception
            status = await self._send_error(exc)
            if named is not None:
                self._local.forget(named)
        finally:
            self._busy = False
            self._observe(status, trio.current_time() - started)

    async def _stream(self, body: CreateResponseBody) -> ResponseRecord | None:
        encoder = SocketEncoder(progress=self._h.progress_events)
        async with opened_stream(body, encoder, self._store) as events:
            async for frame in events:
                if frame:
                    await self._send(frame.decode())
        return encoder.finished

    def _keep(self, record: ResponseRecord, named: str | None) -> None:
        """Remember a finished `store: false` response; a continuation that did not
        complete forgets the response it named."""
        if record.status != "completed":
            if named is not None:
                self._local.forget(named)
        elif not record.store:
            self._local.remember(record)

    async def _send_error(self, exc: Exception) -> int:
        status, body = map_error(exc)
        await self._send(json.dumps({"type": "error", "status": status, **body}))
        return status

    async def _send(self, text: str) -> None:
        async with self._sending:
            await websocket.send(text)

    def _observe(self, status: int, secs: float) -> None:
        """A response on the socket is one exchange to the access log and the metrics."""
        app = cast(App, current_app)
        scope = cast(HTTPScope, {**exchange_scope(), "method": "WS"})
        if app.access_log:
            log_exchange(scope, status, secs)
        if app.metrics is not None:
            app.metrics.observe_request(self._route, "WS", status, secs)


async def _create_body(message: str | bytes) -> dict[str, Any]:
    """The create body a message holds (without its `type`), or the 400 it gets."""
    if isinstance(message, bytes):
        raise InvalidRequest(
            "WebSocket messages must be text frames holding a JSON object.",
            code="invalid_message",
        )
    raw = await off_loop(parse_json, message)  # up to the body limit: not on the loop
    if not isinstance(raw, dict):
        raise InvalidRequest("A message must be a JSON object.", code="invalid_message")
    kind = raw.pop("type", None)
    if kind != "response.create":
        shown = str(kind)[:40]
        raise InvalidRequest(
            f"Unknown message type {shown!r}: this socket takes 'response.create'.",
            param="type",
            code="invalid_value",
        )
    return cast(dict[str, Any], raw)
