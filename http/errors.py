"""The one map from exceptions to HTTP status codes and error bodies.

Every error leaves the server as OpenAI's `{"error": {"message", "type", "param",
"code"}}`, except on the Anthropic routes, which answer Anthropic's `{"type": "error",
"error": {"type", "message"}}` (`anthropic_error`: the same statuses, but a full queue is
529 `overloaded_error`, and a prompt too long says so in Anthropic's words). A 429, 503
or 529 also says when to retry (`error_headers`).
"""

from __future__ import annotations

import logging
from typing import Any

from pydantic import ValidationError
from werkzeug.exceptions import HTTPException

from mlxcel.errors import (
    BodyTimeout,
    ConfigError,
    ContextLengthExceeded,
    GenerationFailed,
    InvalidRequest,
    LimitReached,
    MlxcelError,
    ModelLoadFailed,
    ModelNotReady,
    ModelPinned,
    NotFound,
    Overloaded,
    PermissionDenied,
    QueueFull,
    QuotaExceeded,
    RateLimited,
    RequestRateLimited,
    RequestTooLarge,
    ShuttingDown,
    StoreUnavailable,
    TokenRateLimited,
    Unauthenticated,
    UnsupportedMediaType,
)
from mlxcel.http.item_schemas import ITEM_TAGS

log = logging.getLogger(__name__)

_STATUS: list[tuple[type[MlxcelError], int, str]] = [
    (RequestTooLarge, 413, "invalid_request_error"),
    (BodyTimeout, 408, "invalid_request_error"),
    (UnsupportedMediaType, 415, "invalid_request_error"),
    (InvalidRequest, 400, "invalid_request_error"),
    (NotFound, 404, "invalid_request_error"),
    (Unauthenticated, 401, "invalid_request_error"),
    (PermissionDenied, 403, "permission_denied"),
    (QueueFull, 503, "server_error"),
    (ShuttingDown, 503, "server_error"),
    (RateLimited, 429, "rate_limit_error"),
    (Overloaded, 429, "rate_limit_error"),
    # A key's own limits are typed as OpenAI types them.
    (RequestRateLimited, 429, "requests"),
    (TokenRateLimited, 429, "tokens"),
    (QuotaExceeded, 429, "insufficient_quota"),
    (LimitReached, 429, "rate_limit_error"),
    (ModelNotReady, 503, "server_error"),
    (ModelLoadFailed, 503, "server_error"),
    (ModelPinned, 409, "invalid_request_error"),
    (StoreUnavailable, 503, "server_error"),
    (GenerationFailed, 500, "server_error"),
    (ConfigError, 500, "server_error"),
]


_HTTP_CODES = {
    404: "not_found",
    405: "method_not_allowed",
    408: "request_timeout",
    413: "request_too_large",
    415: "unsupported_media_type",
}


def error_body(
    message: str, type_: str, *, param: str | None = None, code: str | None = None
) -> dict[str, Any]:
    return {"error": {"message": message, "type": type_, "param": param, "code": code}}


def map_error(exc: BaseException) -> tuple[int, dict[str, Any]]:
    """Status and body for any exception a route let through."""
    if isinstance(exc, MlxcelError):
        for cls, status, type_ in _STATUS:
            if isinstance(exc, cls):
                return status, error_body(exc.message, type_, param=exc.param, code=exc.code)
    if isinstance(exc, ValidationError):
        return 400, validation_body(exc)
    if isinstance(exc, HTTPException):
        status = exc.code or 500
        code = _HTTP_CODES.get(status)
        type_ = "invalid_request_error" if status < 500 else "server_error"
        return status, error_body(exc.description or exc.name, type_, code=code)
    log.error("unhandled error", exc_info=exc)
    return 500, error_body("The server had an error while processing your request.", "server_error")


def error_headers(exc: BaseException, status: int) -> dict[str, str]:
    """The headers an error's answer carries besides its body: when to retry a 429, 503
    or 529 (a spent key limit: when its window ends; anything else: in a second)."""
    if isinstance(exc, LimitReached):
        return {"Retry-After": str(exc.retry_after_secs)}
    if status in (429, 503, OVERLOADED):
        return {"Retry-After": "1"}
    return {}


OVERLOADED = 529
"""Anthropic's status for a server with no room now (here: a full waiting line)."""
_ANTHROPIC_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    OVERLOADED: "overloaded_error",
}


def anthropic_type(status: int) -> str:
    """Anthropic's error type for a status."""
    default = "api_error" if status >= 500 else "invalid_request_error"
    return _ANTHROPIC_TYPES.get(status, default)


def anthropic_error(exc: BaseException) -> tuple[int, dict[str, Any]]:
    """Status and Anthropic error body (without its `request_id`) for any exception a
    route of the Messages API let through."""
    status, body = map_error(exc)
    message = body["error"]["message"]
    if isinstance(exc, QueueFull):
        status = OVERLOADED
    if isinstance(exc, ContextLengthExceeded) and exc.tokens is not None:
        message = f"prompt is too long: {exc.tokens} tokens > {exc.maximum} maximum"
    return status, {"type": "error", "error": {"type": anthropic_type(status), "message": message}}


def validation_body(exc: ValidationError) -> dict[str, Any]:
    """A 400 body naming the offending field as OpenAI does (`input[0].content`).

    Of a union's errors the deepest is the most telling, so it is the one reported.
    """
    errors = exc.errors(include_url=False)
    located = [(_param(e["loc"]), e) for e in errors]
    param, first = max(located, key=lambda pair: len(pair[0]))
    message = first["msg"]
    if first["type"] == "missing":
        message = f"Missing required parameter: '{param}'."
    else:
        message = f"Invalid value for '{param}': {message}."
    return error_body(message, "invalid_request_error", param=param or None, code="invalid_value")


_BRANCH_LABELS = frozenset({"str", "int", "float", "bool", "list", "dict", "none"})


def _param(loc: tuple[int | str, ...]) -> str:
    """Field path of an error location, without pydantic's union-branch labels."""
    param = ""
    for part in loc:
        if isinstance(part, int):
            param += f"[{part}]"
        elif "[" in part or part in _BRANCH_LABELS or part in ITEM_TAGS:
            continue
        else:
            param += f".{part}" if param else part
    return param
