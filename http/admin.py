"""Model management (loading and unloading models by hand) is an admin's: each reload
costs every tenant's next request seconds, so an ordinary key must not be able to cause
one at will.

On a server with API keys, only an admin key (`--admin-key`, or `admin=true` in the keys
file, as the keys are now: a SIGHUP's changes apply to the next call) may call the
routes wrapped in `admin_only`; any other key gets 403 `permission_denied`. On a server
without keys the routes are open, as every route is. Each admin key's calls are bounded
by a token bucket (`--admin-rate-limit-rpm`, 429 beyond), and each call gets one log
line on `mlxcel.admin`: the key's name (never the key), the action and the model.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import math
from collections.abc import Awaitable, Callable
from typing import ParamSpec

from quart import Response

from mlxcel.errors import NotFound, PermissionDenied, RequestRateLimited
from mlxcel.http.guards import current_key, current_tenant
from mlxcel.http.handles import handles

log = logging.getLogger("mlxcel.admin")

P = ParamSpec("P")

UNKNOWN_MODEL = "-"
"""The model logged for a name no model has, or for a refused call that named one only in
its body (not read for a caller that may not act)."""


def admin_only(
    action: str,
) -> Callable[[Callable[P, Awaitable[Response]]], Callable[P, Awaitable[Response]]]:
    """The view, run only for an admin key within its rate (`action` names the call in
    the log); the view logs the call it admitted with `note_admin_call`."""

    def wrap(view: Callable[P, Awaitable[Response]]) -> Callable[P, Awaitable[Response]]:
        @functools.wraps(view)
        async def guarded(*args: P.args, **kwargs: P.kwargs) -> Response:
            asked = kwargs.get("model_id")
            check_admin(action, asked if isinstance(asked, str) else None)
            return await view(*args, **kwargs)

        return guarded

    return wrap


def check_admin(action: str, asked: str | None) -> None:
    """403 for a key that is not an admin's (on a server with keys), 429 for an admin
    past its rate; either refusal is logged."""
    h = handles()
    entry = current_key()
    if h.keyring and (entry is None or not entry.admin):
        _refused(action, asked, "permission_denied")
        raise PermissionDenied(
            "Loading and unloading models takes an admin API key (--admin-key, or "
            "admin=true in the keys file); this key is not one.",
            code="permission_denied",
        )
    wait = h.admin_calls.take(current_tenant())
    if wait > 0:
        _refused(action, asked, "rate_limit_exceeded")
        who = f" for key {current_tenant()!r}" if current_tenant() else ""
        raise RequestRateLimited(
            f"Rate limit reached{who} on model loads and unloads: Limit "
            f"{h.admin_calls.per_minute} a minute. Please try again in {math.ceil(wait)}s.",
            retry_after_secs=max(1, math.ceil(wait)),
        )


def note_admin_call(action: str, asked: str) -> None:
    """The log line of an admitted call: who, what, and which model."""
    log.info("key=%s action=%s model=%s", _who(), action, _model(asked))


def _refused(action: str, asked: str | None, reason: str) -> None:
    model = UNKNOWN_MODEL if asked is None else _model(asked)
    log.warning("key=%s action=%s model=%s refused=%s", _who(), action, model, reason)


def _model(asked: str) -> str:
    """The configured model `asked` names, or `-`: a name is a client's text, and only
    a configured model's name reaches the log."""
    with contextlib.suppress(NotFound):
        return handles().fleet.find(asked)
    return UNKNOWN_MODEL


def _who() -> str:
    return current_tenant() or "-"
