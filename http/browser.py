"""What keeps web pages off the API unless the server says otherwise: CORS and the Host
check.

CORS (`--cors-origins`) is off by default, and then no CORS header is ever sent, so a
browser lets no other origin's page read an answer. Given, a preflight (`OPTIONS` with
`Origin` and `Access-Control-Request-Method`) is answered here, before the API-key guard
(browsers send no `Authorization` on a preflight), and answers to a listed origin carry
`Access-Control-Allow-Origin`.

A server bound to a loopback address is meant for this machine only; a page on another
site could still reach it by DNS rebinding (its name re-pointed at 127.0.0.1), but its
requests then carry that name in `Host`. So such a server refuses every request whose
`Host` is not a loopback name (403, `host_not_allowed`). Bound to any other address, it
is reachable by other names on purpose, and `Host` is not checked.
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import cast

from hypercorn.typing import HTTPScope, Scope

Headers = list[tuple[bytes, bytes]]

LOOPBACK_NAMES = frozenset({"localhost", "127.0.0.1", "[::1]"})
"""The `Host` names (any port) a loopback-bound server answers."""

ALLOW_METHODS = b"GET, POST, DELETE, OPTIONS"
ALLOW_HEADERS = ("authorization", "x-api-key", "content-type", "accept", "idempotency-key")
_SDK_HEADER_PREFIXES = ("x-stainless-", "openai-", "anthropic-")
"""The SDKs' own request headers (`x-stainless-os`, `openai-organization`,
`anthropic-version`, ...)."""
_RATE_LIMIT_HEADERS = tuple(
    f"x-ratelimit-{what}-{of}".encode()
    for of in ("requests", "tokens")
    for what in ("limit", "remaining", "reset")
)
EXPOSE_HEADERS = b", ".join((b"retry-after", b"x-request-id", b"request-id", *_RATE_LIMIT_HEADERS))
"""The answer headers a page may read: `Retry-After`, the request's id (Anthropic's
routes) and the per-key rate limits'."""
PREFLIGHT_MAX_AGE = b"600"
_TOKEN = re.compile(r"[!#$%&'*+.^_`|~0-9a-z-]+")
"""A header name (RFC 9110 token, lower-cased): only such names are echoed in a grant."""
_PORT = re.compile(r":[0-9]{1,5}")


def is_loopback_bind(host: str) -> bool:
    """Whether the listening address `host` is this machine's alone."""
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def _header(scope: HTTPScope, name: bytes) -> str | None:
    for key, value in scope["headers"]:
        if key.lower() == name:
            return value.decode("latin-1")
    return None


def _host_name(host: str) -> str:
    """The name part of a `Host` value, without its port or a root label's trailing dot,
    lower-cased; a value with anything after a bracketed address but a port is returned
    whole (`[::1]evil.com` names no loopback host)."""
    host = host.strip().lower()
    if host.startswith("["):
        address, _, rest = host.partition("]")
        return address + "]" if rest == "" or _PORT.fullmatch(rest) else host
    name, _, port = host.rpartition(":")
    if not (name and port.isdigit()):
        name = host
    return name[:-1] if name.endswith(".") else name


@dataclass(frozen=True, slots=True)
class BrowserPolicy:
    """What a browser may do with this server: the origins whose pages may read its answers
    (CORS), and whether a loopback-bound server refuses other host names (DNS rebinding)."""

    cors_origins: frozenset[str] = frozenset()
    """Origins whose pages may read answers; `*` is any. Empty: CORS is off."""
    check_host: bool = False
    """Refuse a `Host` that is not a loopback name (the server is bound to loopback)."""

    @classmethod
    def of(cls, cors_origins: Iterable[str], bind_host: str) -> BrowserPolicy:
        origins = frozenset(o if o == "*" else o.rstrip("/").lower() for o in cors_origins)
        return cls(origins, is_loopback_bind(bind_host))

    def host_allowed(self, scope: HTTPScope) -> bool:
        """False for a request to a loopback-bound server naming another host. A request
        without `Host` (HTTP/1.0) names none, and is not a browser's."""
        if not self.check_host:
            return True
        host = _header(scope, b"host")
        return host is None or _host_name(host) in LOOPBACK_NAMES

    def socket_allowed(self, scope: Scope) -> bool:
        """Whether a WebSocket may open: its `Host` as a request's, and a browser's page
        (it sends `Origin`, and a page may open a socket to any address without asking)
        only from a listed origin."""
        http_like = cast(HTTPScope, scope)
        if not self.host_allowed(http_like):
            return False
        return _header(http_like, b"origin") is None or self._allowed_origin(http_like) is not None

    def is_preflight(self, scope: HTTPScope) -> bool:
        """A CORS preflight this server answers itself (only when CORS is on)."""
        return (
            bool(self.cors_origins)
            and scope["method"] == "OPTIONS"
            and _header(scope, b"origin") is not None
            and _header(scope, b"access-control-request-method") is not None
        )

    def preflight_headers(self, scope: HTTPScope) -> Headers:
        """The headers of the 204 answering a preflight: the grant if its origin is
        listed, none otherwise (the browser then refuses the request)."""
        allowed = self._allowed_origin(scope)
        if allowed is None:
            return [(b"vary", b"Origin")]
        asked = _header(scope, b"access-control-request-headers") or ""
        sdk = [
            name
            for name in (part.strip().lower() for part in asked.split(","))
            if name.startswith(_SDK_HEADER_PREFIXES) and _TOKEN.fullmatch(name)
        ]
        return [
            (b"access-control-allow-origin", allowed.encode("latin-1")),
            (b"access-control-allow-methods", ALLOW_METHODS),
            (b"access-control-allow-headers", ", ".join((*ALLOW_HEADERS, *sdk)).encode()),
            (b"access-control-max-age", PREFLIGHT_MAX_AGE),
            (b"vary", b"Origin"),
        ]

    def response_headers(self, scope: HTTPScope) -> Headers:
        """The CORS headers of an answer (none unless its origin is listed)."""
        allowed = self._allowed_origin(scope)
        if allowed is None:
            return [(b"vary", b"Origin")] if self.cors_origins else []
        return [
            (b"access-control-allow-origin", allowed.encode("latin-1")),
            (b"access-control-expose-headers", EXPOSE_HEADERS),
            (b"vary", b"Origin"),
        ]

    def _allowed_origin(self, scope: HTTPScope) -> str | None:
        if not self.cors_origins:
            return None
        origin = _header(scope, b"origin")
        if origin is None:
            return None
        if "*" in self.cors_origins:
            return "*"
        return origin if origin.lower() in self.cors_origins else None
