"""Webhooks: where the end of a background response is announced, and how each
announcement is signed.

A target is a URL and its secret, given by the operator only (`--webhook-url` and
`--webhook-secret`, or a key's own in the keys file); nothing a request carries names one.
An announcement is the hosted API's event (`response.completed`, `.failed`, `.incomplete`,
`.cancelled`) signed as Standard Webhooks sign one: `webhook-id` (the event's id, the same
on every attempt), `webhook-timestamp` (this attempt's Unix time) and `webhook-signature`
(`v1,` and the base64 HMAC-SHA256, keyed by the secret's base64-decoded bytes after
`whsec_`, of `{id}.{timestamp}.{body}`), which the openai SDK's `webhooks.unwrap` checks.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import json
import random
import secrets
from dataclasses import dataclass, field
from urllib.parse import urlsplit

from mlxcel.errors import ConfigError

SECRET_PREFIX = "whsec_"
EVENT_TYPES = {
    "completed": "response.completed",
    "failed": "response.failed",
    "incomplete": "response.incomplete",
    "cancelled": "response.cancelled",
}
"""The event announcing each way a response ends."""
MAX_BACKOFF_SECS = 600.0
"""No wait between two attempts at one delivery is longer than this."""


@dataclass(frozen=True, slots=True)
class WebhookTarget:
    """Where an end is announced and the key it is signed with (the decoded secret)."""

    url: str
    key: bytes = field(repr=False)


def parse_target(url: str | None, secret: str | None, where: str) -> WebhookTarget | None:
    """The target of a URL and its `whsec_` secret, None when neither is given;
    ConfigError (naming `where`, never the secret) when one comes without the other, the
    URL is not an absolute http(s) URL, or the secret is not `whsec_` and base64."""
    if url is None and secret is None:
        return None
    if url is None or secret is None:
        raise ConfigError(f"{where}: a webhook needs both its URL and its secret")
    parts = urlsplit(url)
    try:
        _ = parts.port  # a port out of range or not a number raises
    except ValueError:
        parts = parts._replace(netloc="")
    if parts.scheme not in ("http", "https") or not parts.hostname or parts.fragment:
        raise ConfigError(f"{where}: the webhook URL must be an absolute http:// or https:// URL")
    return WebhookTarget(url, secret_key(secret, where))


def secret_key(secret: str, where: str) -> bytes:
    """The HMAC key of a `whsec_` secret: the base64 after the prefix, decoded."""
    if not secret.startswith(SECRET_PREFIX):
        raise ConfigError(f"{where}: the webhook secret must begin with {SECRET_PREFIX}")
    try:
        key = base64.b64decode(secret[len(SECRET_PREFIX) :], validate=True)
    except (binascii.Error, ValueError):
        raise ConfigError(
            f"{where}: the webhook secret after {SECRET_PREFIX} is not base64"
        ) from None
    if len(key) < 16:
        raise ConfigError(f"{where}: the webhook secret must hold at least 16 bytes")
    return key


def new_event_id() -> str:
    return "evt_" + secrets.token_hex(16)


def event_body(event_id: str, status: str, response_id: str, created_at: int) -> bytes:
    """The event announcing that `response_id` ended with `status`, as sent (compact
    JSON: the bytes signed are the bytes posted)."""
    event = {
        "id": event_id,
        "object": "event",
        "type": EVENT_TYPES[status],
        "created_at": created_at,
        "data": {"id": response_id},
    }
    return json.dumps(event, separators=(",", ":")).encode()


def signed_headers(key: bytes, event_id: str, timestamp: int, body: bytes) -> dict[str, str]:
    """The Standard Webhooks headers of one attempt to post `body`."""
    signed = f"{event_id}.{timestamp}.".encode() + body
    digest = hmac.new(key, signed, hashlib.sha256).digest()
    return {
        "content-type": "application/json",
        "webhook-id": event_id,
        "webhook-timestamp": str(timestamp),
        "webhook-signature": "v1," + base64.b64encode(digest).decode(),
    }


def backoff_secs(attempts: int, base_secs: float, rng: random.Random | None = None) -> float:
    """The wait before the next attempt after `attempts` failed ones: `base_secs`
    doubled each time, capped, and jittered down to as little as half so that
    deliveries failed together do not come back together."""
    ceiling = min(MAX_BACKOFF_SECS, base_secs * 2.0 ** min(max(0, attempts - 1), 60))
    return ceiling * (0.5 + 0.5 * (rng or random).random())
