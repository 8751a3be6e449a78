"""Checks every request passes before its route runs: the API key, a JSON body, and no
new generation while the server drains.

Each raises an `MlxcelError`, so its answer is shaped by the one error map.
"""

from __future__ import annotations

from typing import cast

import trio
from quart import has_websocket_context, request, websocket
from quart.wrappers import BaseRequestWebsocket

from mlxcel.errors import ShuttingDown, Unauthenticated, UnsupportedMediaType
from mlxcel.keys import ApiKey, Keyring, key_name

__all__ = [
    "TENANT_KEY",
    "check_api_key",
    "check_json_body",
    "check_not_stopping",
    "current_key",
    "current_tenant",
    "exchange_scope",
    "key_name",
]

TENANT_KEY = "mlxcel.tenant"
"""Where a request's scope keeps its tenant: the name of the API key it carried."""
API_KEY_KEY = "mlxcel.api_key"
"""Where a request's scope keeps the entry (`ApiKey`) of the key it carried."""

_OPEN_PATHS = frozenset({"/health", "/"})
"""Readiness, and the root a client probes (`HEAD /`) before it sends its key."""
_METRICS_PATHS = frozenset({"/metrics", "/v1/metrics"})
_GENERATING = (
    "/responses",
    "/responses/compact",
    "/chat/completions",
    "/completions",
    "/messages",
)


def check_api_key(keyring: Keyring, *, metrics_public: bool = False) -> ApiKey | None:
    """401 unless the request carries a key of `keyring`, as `Authorization: Bearer
    <key>` or (as Anthropic's clients send it) `x-api-key: <key>`; `/health` and `/` are
    open, and `/metrics` too when `metrics_public`. The key's entry (its name and limits)
    is kept in the request's scope (`current_key`, `current_tenant`).

    The headers are Latin-1 text; their bytes are matched in constant time over all keys."""
    current = _current()
    if not keyring or current.path in _OPEN_PATHS:
        return None
    if metrics_public and current.path in _METRICS_PATHS:
        return None
    scheme, _, given = current.headers.get("Authorization", "").strip().partition(" ")
    entry = _match(keyring, given) if scheme.lower() == "bearer" else None
    if entry is None and "x-api-key" in current.headers:
        entry = _match(keyring, current.headers["x-api-key"])
    if entry is not None:
        scope = exchange_scope()
        scope[TENANT_KEY] = entry.name
        scope[API_KEY_KEY] = entry
        return entry
    raise Unauthenticated(
        "Incorrect or missing API key. Send it as 'Authorization: Bearer <key>' "
        "or 'x-api-key: <key>'.",
        code="invalid_api_key",
    )


def _current() -> BaseRequestWebsocket:
    """The HTTP request or the WebSocket being served."""
    return websocket if has_websocket_context() else request


def exchange_scope() -> dict[str, object]:
    """The ASGI scope of the exchange being served: an HTTP request's, or a WebSocket's
    (its responses run one at a time, each keeping its key, admission and access-log
    note there as a request does)."""
    return cast(dict[str, object], _current().scope)


def _match(keyring: Keyring, given: str) -> ApiKey | None:
    try:
        return keyring.match(given.strip().encode("latin-1"))
    except UnicodeEncodeError:  # not a header's text: no key matches it
        return None


def current_key() -> ApiKey | None:
    """The entry of the key the request being served carried (its name and its own
    limits), or None when the server takes no keys or the path is open."""
    found = exchange_scope().get(API_KEY_KEY)
    return found if isinstance(found, ApiKey) else None


def current_tenant() -> str:
    """The tenant of the request being served: its API key's name, or "" when the
    server takes no keys (one tenant)."""
    return cast(str, exchange_scope().get(TENANT_KEY, ""))


def check_json_body() -> None:
    """415 for a body that is not declared JSON (`application/json` or `…+json`).

    A web page can post `text/plain` or a form to any address without asking first; only
    a JSON content type makes the browser ask, so this keeps pages off the API."""
    if not _has_body():
        return
    mimetype = request.mimetype
    if mimetype == "application/json" or (
        mimetype.startswith("application/") and mimetype.endswith("+json")
    ):
        return
    shown = mimetype or "none"
    raise UnsupportedMediaType(
        f"Unsupported Content-Type {shown[:80]!r}: request bodies must be application/json.",
        code="unsupported_media_type",
    )


def check_not_stopping(stopping: trio.Event) -> None:
    """503 for a request that would start a generation while the server drains."""
    if not stopping.is_set() or request.method != "POST":
        return
    if request.path.rstrip("/").endswith(_GENERATING):
        raise ShuttingDown(
            "The server is shutting down; retry on another server.",
            code="server_shutting_down",
        )


def _has_body() -> bool:
    if request.content_length:
        return True
    return "chunked" in request.headers.get("Transfer-Encoding", "").lower()
