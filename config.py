"""Settings: one frozen record built from flags and environment (flags win); and the per-user
cache folder every part that keeps files between runs shares (`cache_dir`)."""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from mlxcel.errors import ConfigError
from mlxcel.store.limits import StoreLimits, redis_url, sqlite_path

if TYPE_CHECKING:
    from mlxcel.webhooks import WebhookTarget

__all__ = ["Settings", "StoreLimits", "cache_dir"]

_ORIGIN = re.compile(r"https?://[^/\s]+", re.IGNORECASE)


def cache_dir() -> Path:
    """The per-user cache folder: converted models, the native builds (BLAS shim and CPU
    kernels), the prompt cache's default disk tier.

    `MLXCEL_CACHE_DIR` moves it; otherwise it is the folder each OS defines for caches
    (on Linux `$XDG_CACHE_HOME/mlxcel`, else `~/.cache/mlxcel`). Read at each call, so a
    process (or a test) that changes the environment gets the folder it names.
    """
    override = os.environ.get("MLXCEL_CACHE_DIR")
    if override:
        return Path(override).expanduser()
    from platformdirs import user_cache_dir  # only when asked: settings load nothing more

    return Path(user_cache_dir("mlxcel"))


@dataclass(frozen=True, slots=True)
class Settings:
    """Every setting of one server, frozen: made once from the flags, the environment and the
    files they name (`cli/flag_table.py`), then read by every room, so no room parses flags."""

    model: Path | None = None
    """A local MLX model folder; None means the embedded default model."""
    alias: str | None = None
    model_aliases: tuple[tuple[str, str], ...] = ()
    """`(PATTERN, NAME)` pairs from `--model-alias`: a request's `model` matching the glob
    PATTERN is served by NAME, which must be a served model's (checked at start)."""
    named_models: tuple[tuple[str, Path], ...] = ()
    """`--model NAME=PATH`, in order: more models the server may load by name (after
    `model`, when given; otherwise the first of these is the default)."""
    models_dir: Path | None = None
    """`--models-dir`: each MLX model folder in it is a model, named by its folder."""
    max_loaded_models: int = 1
    """At most this many models are loaded at once (the least recently used unpinned
    one is unloaded to make room)."""
    idle_unload_secs: float = 0.0
    """A model no request used for this long is unloaded; 0 keeps models loaded."""
    pinned_models: tuple[str, ...] = ()
    """`--pin`: models loaded at start and never unloaded."""
    host: str = "127.0.0.1"
    port: int = 8080
    ctx_size: int | None = None
    """Context window in tokens; None means the model's own maximum."""
    parallel: int = 4
    """Generation slots: sequences decoded together in one batch."""
    max_queue_depth: int = 32
    """Requests allowed to wait for a slot; beyond it, 503."""
    prefill_step_size: int = 512
    """Prompt tokens one engine step reads at most, all prompts together."""
    max_step_ms: float = 0.0
    """How long a step that reads prompts may last while streams decode, so a burst of
    prompts cannot stall them; 0 derives it: 1.5 times a full batch's decode step."""
    prompt_cache_bytes: int = 2 * 1024**3
    """KV states kept for reuse by later prompts that start alike, plus the live
    sequences' own, in bytes; 0 disables the prompt cache."""
    prompt_cache_dir: Path | None = None
    """Where the prompt cache's KV states spill to files that outlive the process; None:
    under the user cache folder with a SQLite store, nowhere otherwise (`cli.prompt_cache`
    resolves it at start; after that None means no disk tier)."""
    prompt_cache_disk_bytes: int = 4 * 1024**3
    """Bytes of prompt-cache files kept under that folder (least recently used go first);
    0 disables the disk tier."""
    tool_call_parser: str | None = None
    """The model's tool-call format; None picks it from the chat template. The name is
    checked where the parser is picked (`mlxcel.app`), so settings need no parser import."""
    sse_keepalive_secs: float = 10.0
    websocket_idle_secs: float = 300.0
    """A `/v1/responses` WebSocket with no response running that sends nothing for this
    long is closed: an idle socket holds a connection of the cap."""
    progress_events: bool = True
    """A stream's keep-alives are `mlx.progress` data events (queue place, prompt read),
    which clients that give up on a silent stream count; off, they are SSE comments."""
    api_keys: tuple[str, ...] = ()
    """Keys from `--api-key` and `LLAMA_API_KEY` (each may hold several, comma-separated)."""
    api_key_file: Path | None = None
    """A keys file (`mlxcel.keys`), read at start and again on SIGHUP."""
    admin_keys: tuple[str, ...] = field(default=(), repr=False)
    """Keys from `--admin-key`: accepted like the others, and they may load and unload
    models (as may the keys file's `admin=true` keys); never shown."""
    admin_rate_limit_rpm: int = 6
    """Model loads and unloads each admin key may ask for a minute (a token bucket that
    holds this many); 0 = no limit."""
    access_log: bool = True
    """One INFO line on `mlxcel.access` per request."""
    cors_origins: tuple[str, ...] = ()
    """Origins whose pages may call the API (`*`: any); empty, no CORS headers at all."""
    store: str = "memory"
    """Where stored state lives: `memory` (gone with the process), `sqlite[:PATH]` (a
    file that survives restarts) or `redis://...` (a server replicas share)."""
    redis_key_prefix: str = "mlxcel"
    replica_lease_secs: float = 15.0
    responses: StoreLimits = StoreLimits(1024, 268_435_456, 3600)
    conversations: StoreLimits = StoreLimits(256, 67_108_864, 3600)
    background_max_jobs: int = 64
    background_ephemeral_ttl_secs: float = 600
    max_events_per_response: int = 65_536
    """Frames a background response's event log keeps (`GET ...?stream=true`)."""
    reasoning_echo_max_bytes: int = 16 * 1024 * 1024
    send_timeout_secs: float = 30.0
    """A stream whose client reads nothing for this long is treated as gone."""
    shutdown_timeout_secs: float = 30.0
    """On SIGTERM/SIGINT, in-flight responses get this long to finish."""
    body_timeout_secs: float = 60.0
    """A request body must arrive whole within this many seconds (408 otherwise)."""
    read_timeout_secs: float = 30.0
    """A connection that sends no byte of a request (headers) for this long is closed."""
    max_connections: int = 1024
    """Open HTTP connections at once; more wait in the listen backlog."""
    hosted_tools: str = "reject"
    """Hosted tool types in a request (web_search, ...): `reject` answers 400, `ignore`
    drops them from what the model sees."""
    images: str = "placeholder"
    """Images for a model without vision: `placeholder` has it read a short note for
    each, `reject` answers 400."""
    metrics_public: bool = False
    """`/metrics` answers without an API key (for a scraper inside a trusted network)."""
    rate_limit_rpm: int = 0
    """Requests a minute each API key may start on the generating routes; 0 = no limit."""
    rate_limit_tpm: int = 0
    """Input and output tokens a minute each API key may spend; 0 = no limit."""
    daily_token_quota: int = 0
    """Input and output tokens each API key may spend in a UTC day; 0 = no quota."""
    webhook_url: str | None = None
    """Where the ends of background responses are announced (with `webhook_secret`)."""
    webhook_secret: str | None = field(default=None, repr=False)
    """The `whsec_` secret webhook deliveries are signed with; never shown."""
    webhook_max_attempts: int = 8
    """Attempts at one delivery before it is given up."""
    webhook_timeout_secs: float = 10.0
    """How long one attempt may take, connecting included."""
    webhook_backoff_secs: float = 2.0
    """The wait after a delivery's first failed attempt; it doubles after each."""
    webhook_max_pending_per_key: int = 1_000
    """Deliveries one key (tenant) keeps pending at most; its jobs beyond run unannounced."""

    def __post_init__(self) -> None:
        checks: list[tuple[bool, str]] = [
            (0 <= self.port <= 65535, "--port must be between 0 (any free port) and 65535"),
            (self.parallel >= 1, "--parallel must be at least 1"),
            (self.max_queue_depth >= 0, "--max-queue-depth must be 0 or more"),
            (self.prefill_step_size >= 16, "--prefill-step-size must be at least 16"),
            (self.max_step_ms >= 0, "--max-step-ms must be 0 (derived) or more"),
            (self.prompt_cache_bytes >= 0, "--prompt-cache-bytes must be 0 or more"),
            (self.prompt_cache_disk_bytes >= 0, "--prompt-cache-disk-bytes must be 0 or more"),
            (self.ctx_size is None or self.ctx_size >= 16, "--ctx-size must be at least 16"),
            (self.sse_keepalive_secs > 0, "--sse-keepalive-secs must be positive"),
            (self.websocket_idle_secs > 0, "--websocket-idle-secs must be positive"),
            (self.responses.max_entries >= 0, "--responses-store-max-entries must be >= 0"),
            (self.responses.max_bytes >= 0, "--responses-store-max-bytes must be >= 0"),
            (self.responses.ttl_secs >= 0, "--responses-store-ttl-secs must be >= 0"),
            (self.conversations.max_entries >= 0, "--conversation-store-max-entries must be >= 0"),
            (self.conversations.max_bytes >= 0, "--conversation-store-max-bytes must be >= 0"),
            (self.conversations.ttl_secs >= 0, "--conversation-store-ttl-secs must be >= 0"),
            (self.background_max_jobs >= 0, "--responses-background-max-jobs must be >= 0"),
            (self.max_events_per_response >= 0, "--max-events-per-response must be >= 0"),
            (
                self.background_ephemeral_ttl_secs >= 1,
                "--responses-background-ephemeral-ttl-secs must be at least 1",
            ),
            (self.send_timeout_secs > 0, "--send-timeout-secs must be positive"),
            (self.shutdown_timeout_secs >= 0, "--shutdown-timeout-secs must be 0 or more"),
            (self.body_timeout_secs > 0, "--body-timeout-secs must be positive"),
            (self.read_timeout_secs > 0, "--read-timeout-secs must be positive"),
            (self.max_connections >= 1, "--max-connections must be at least 1"),
            (self.reasoning_echo_max_bytes >= 0, "--reasoning-echo-max-bytes must be >= 0"),
            (
                self.hosted_tools in ("reject", "ignore"),
                "--hosted-tools must be reject or ignore",
            ),
            (self.images in ("reject", "placeholder"), "--images must be reject or placeholder"),
            (self.rate_limit_rpm >= 0, "--rate-limit-rpm must be 0 (off) or more"),
            (self.rate_limit_tpm >= 0, "--rate-limit-tpm must be 0 (off) or more"),
            (self.daily_token_quota >= 0, "--daily-token-quota must be 0 (off) or more"),
            (self.admin_rate_limit_rpm >= 0, "--admin-rate-limit-rpm must be 0 (off) or more"),
            (
                all(p.strip() and n.strip() for p, n in self.model_aliases),
                "--model-alias takes PATTERN=NAME, both non-empty (claude-*=my-model)",
            ),
            (self.replica_lease_secs >= 0.3, "--replica-lease-secs must be at least 0.3"),
            (
                bool(self.redis_key_prefix) and not set("{}\n") & set(self.redis_key_prefix),
                "--redis-key-prefix must be non-empty, without braces or newlines",
            ),
            (
                all(o == "*" or _ORIGIN.fullmatch(o) for o in self.cors_origins),
                "--cors-origins takes `*` or origins like https://app.example:8443 "
                "(scheme, host and port; no path)",
            ),
        ]
        checks += self._model_checks()
        for ok, message in checks:
            if not ok:
                raise ConfigError(message)
        self._check_webhook()
        self._check_store()

    def _check_store(self) -> None:
        try:
            sqlite_path(self.store)
            redis_url(self.store)
        except ValueError as exc:
            raise ConfigError(str(exc)) from None

    def _check_webhook(self) -> None:
        checks = [
            (self.webhook_max_attempts >= 1, "--webhook-max-attempts must be at least 1"),
            (self.webhook_timeout_secs > 0, "--webhook-timeout-secs must be positive"),
            (self.webhook_backoff_secs > 0, "--webhook-backoff-secs must be positive"),
            (
                self.webhook_max_pending_per_key >= 1,
                "--webhook-max-pending-per-key must be at least 1",
            ),
        ]
        for ok, message in checks:
            if not ok:
                raise ConfigError(message)
        _ = self.webhook  # the URL and the secret

    @property
    def webhook(self) -> WebhookTarget | None:
        """The server's webhook target; ConfigError when `--webhook-url` and
        `--webhook-secret` do not make one."""
        from mlxcel.webhooks import parse_target  # only when read: settings load no layer

        return parse_target(self.webhook_url, self.webhook_secret, "--webhook-url/--webhook-secret")

    def _model_checks(self) -> list[tuple[bool, str]]:
        return [
            (self.max_loaded_models >= 1, "--max-loaded-models must be at least 1"),
            (self.idle_unload_secs >= 0, "--idle-unload-secs must be 0 (never) or more"),
        ]

    @property
    def background_enabled(self) -> bool:
        return (
            self.background_max_jobs > 0
            and self.responses.max_entries > 0
            and self.responses.max_bytes > 0
        )
