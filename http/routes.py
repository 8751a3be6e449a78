"""The app: every blueprint mounted with and without `/v1`, one error handler, and the
guards every request passes first.

The blueprints (`responses`, `chat`, `messages`, `compact`, `stored`, `conversations`,
`conversation_items`, `service`, `prometheus`) are thin: body → prepare → one actor command
→ JSON or SSE. They read the actors' handles from the app (`http/handles.py`).
"""

from __future__ import annotations

from typing import cast

from quart import Blueprint, Response, has_websocket_context, request
from quart_trio import QuartTrio

from mlxcel.http.body import MAX_BODY_BYTES
from mlxcel.http.browser import BrowserPolicy
from mlxcel.http.chat import chat
from mlxcel.http.compact import compact
from mlxcel.http.conversation_items import conversation_items
from mlxcel.http.conversations import conversations
from mlxcel.http.errors import anthropic_error, error_headers, map_error
from mlxcel.http.exchange import ROUTE_KEY, App
from mlxcel.http.guards import check_api_key, check_json_body, check_not_stopping
from mlxcel.http.handles import Handles, handles, install, json_response
from mlxcel.http.messages import add_request_id, messages, request_id, speaks_anthropic
from mlxcel.http.prometheus import prometheus
from mlxcel.http.rate_limits import add_rate_limit_headers
from mlxcel.http.responses import responses
from mlxcel.http.responses_socket import responses_socket
from mlxcel.http.service import health_routes, service
from mlxcel.http.stored import stored

__all__ = ["Handles", "create_app"]

API: tuple[Blueprint, ...] = (
    responses,
    responses_socket,
    chat,
    messages,
    compact,
    stored,
    conversations,
    conversation_items,
    service,
    prometheus,
)
"""Mounted twice: under `/v1`, as the SDKs call them, and at the root."""


def create_app(
    handles_: Handles,
    *,
    body_timeout_secs: float,
    access_log: bool = False,
    browser: BrowserPolicy | None = None,
) -> QuartTrio:
    """The app serving `handles_`; `access_log` writes a line per exchange on
    `mlxcel.access`, `browser` is the CORS and Host policy (none by default)."""
    app = App("mlxcel", static_folder=None)  # no static files: only the API's routes
    # Generation can take minutes; streams end when generation ends, not on a timer.
    app.config["RESPONSE_TIMEOUT"] = None
    app.config["BODY_TIMEOUT"] = body_timeout_secs
    app.config["MAX_CONTENT_LENGTH"] = MAX_BODY_BYTES
    install(app, handles_)
    app.metrics = handles_.metrics
    app.access_log = access_log
    app.browser = browser or BrowserPolicy()
    app.register_error_handler(Exception, _answer_error)
    app.before_request(_name_route)  # first: a request the guards refuse is counted too
    app.before_request(_guard)
    app.after_request(add_rate_limit_headers)  # refusals too: errors pass through it
    app.after_request(add_request_id)
    app.register_blueprint(health_routes)
    for blueprint in API:
        app.register_blueprint(blueprint)
        app.register_blueprint(blueprint, url_prefix="/v1", name=f"v1_{blueprint.name}")
    return app


async def _answer_error(exc: Exception) -> Response:
    if has_websocket_context():  # a WebSocket refused before it opened (404): no dialect
        status, body = map_error(exc)
        return json_response(body, status)
    if speaks_anthropic():
        status, body = anthropic_error(exc)
        body["request_id"] = request_id()
    else:
        status, body = map_error(exc)
    response = json_response(body, status)
    response.headers.update(error_headers(exc, status))
    return response


async def _name_route() -> None:
    """The URL rule the request matched, for the exchange's metrics (not the raw path:
    the label's values stay bounded)."""
    if request.url_rule is not None:
        cast(dict[str, object], request.scope)[ROUTE_KEY] = request.url_rule.rule


async def _guard() -> None:
    h = handles()
    check_api_key(h.keyring, metrics_public=h.metrics_public)
    check_json_body()
    check_not_stopping(h.stopping)
