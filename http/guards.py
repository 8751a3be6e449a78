"""Checks every request passes before its route runs: the API key, a JSON body, and no
new generation while the server drains.

Each raises an `MlxcelError`, so its answer is shaped by the one error map.
"""

from __future__ import annotations

import hashlib
import hmac
from typing import cast

import trio
from quart import request

from mlxcel.errors import ShuttingDown, Unauthenticated, UnsupportedMediaType

TENANT_KEY = "mlxcel.tenant"
"""Where a request's scope keeps its tenant: the name of the API key it carried."""

_OPEN_PATHS = frozenset({"/health"})
_METRICS_PATHS = frozenset({"/metrics", "/v1/metrics"})
_GENERATING = ("/responses", "/responses/compact")


def check_api_key(api_keys: tuple[str, ...], *, metrics_public: bool = False) -> None:
    """401 unless the request carries `Authorization: Bearer <one of api_keys>`;
    `/health` is open, and `/metrics` too when `metrics_public`.

    Keys are compared as bytes in constant time: a header is any Latin-1 text, and
    `hmac.compare_digest` refuses strings that are not ASCII."""
    if not api_keys or request.path in _OPEN_PATHS:
        return
    if metrics_public and request.path in _METRICS_PATHS:
        return
    scheme, _, given = request.headers.get("Authorization", "").strip().partition(" ")
    presented = given.strip().encode()
    matched = [hmac.compare_digest(presented, key.encode()) for key in api_keys]
    if scheme.lower() == "bearer" and any(matched):
        key = api_keys[matched.index(True)]
        cast(dict[str, object], request.scope)[TENANT_KEY] = key_name(key)
        return
    raise Unauthenticated(
        "Incorrect or missing API key. Send it as 'Authorization: Bearer <key>'.",
        code="invalid_api_key",
    )


def key_name(key: str) -> str:
    """How a key without a name is known (logs, tenancy): a short hash, never the key."""
    return "key-" + hashlib.sha256(key.encode()).hexdigest()[:12]


def current_tenant() -> str:
    """The tenant of the request being served: its API key's name, or "" when the
    server takes no keys (one tenant)."""
    return cast(str, cast(dict[str, object], request.scope).get(TENANT_KEY, ""))


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
