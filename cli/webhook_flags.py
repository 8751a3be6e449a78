"""The webhook flags (`mlxcel.webhooks`), beside the table of the others."""

from __future__ import annotations

from mlxcel.cli.flag_table import Flag
from mlxcel.config import Settings

_DEFAULTS = Settings()

WEBHOOK_FLAGS: tuple[Flag, ...] = (
    Flag(
        ("--webhook-url",),
        "webhook_url",
        str,
        _DEFAULTS.webhook_url,
        "MLXCEL_WEBHOOK_URL",
        "announce the end of each background response (response.completed, .failed, "
        ".incomplete, .cancelled) with a signed POST to this http(s) URL; a key in the "
        "keys file may have its own (webhook_url=, webhook_secret=)",
    ),
    Flag(
        ("--webhook-secret",),
        "webhook_secret",
        str,
        _DEFAULTS.webhook_secret,
        "MLXCEL_WEBHOOK_SECRET",
        "the whsec_ secret (base64 after the prefix) webhook deliveries are signed with, "
        "as Standard Webhooks and the openai SDK's webhooks.unwrap expect",
    ),
    Flag(
        ("--webhook-max-attempts",),
        "webhook_max_attempts",
        int,
        _DEFAULTS.webhook_max_attempts,
        "MLXCEL_WEBHOOK_MAX_ATTEMPTS",
        "attempts at one webhook delivery (any answer but 2xx, a refused connection or a "
        "timeout fails one) before it is given up",
    ),
    Flag(
        ("--webhook-timeout-secs",),
        "webhook_timeout_secs",
        float,
        _DEFAULTS.webhook_timeout_secs,
        "MLXCEL_WEBHOOK_TIMEOUT_SECS",
        "seconds one webhook attempt may take, connecting included",
    ),
    Flag(
        ("--webhook-backoff-secs",),
        "webhook_backoff_secs",
        float,
        _DEFAULTS.webhook_backoff_secs,
        "MLXCEL_WEBHOOK_BACKOFF_SECS",
        "the wait after a webhook delivery's first failed attempt; it doubles after each "
        "(jittered, at most 600 s)",
    ),
    Flag(
        ("--webhook-max-pending-per-key",),
        "webhook_max_pending_per_key",
        int,
        _DEFAULTS.webhook_max_pending_per_key,
        "MLXCEL_WEBHOOK_MAX_PENDING_PER_KEY",
        "webhook deliveries one API key keeps pending at most (of the 10,000 the store "
        "keeps); its background responses beyond it run unannounced, logged and counted",
    ),
)
