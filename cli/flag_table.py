"""Every serve flag: its names (as llama-server names them), the setting it fills, its
type, its default (the setting's, from `config.py`), its environment variable and its
help. `cli/flags.py` turns this table into the command line's parser and the settings."""

from __future__ import annotations

from pathlib import Path

from mlxcel.cli.flag_kinds import Flag, switch
from mlxcel.cli.model_flag_table import MODEL_FLAGS
from mlxcel.config import Settings

__all__ = ["FLAGS", "Flag", "switch"]


_DEFAULTS = Settings()
"""Each flag's default is its setting's, so defaults are written once, in config.py."""

FLAGS: tuple[Flag, ...] = (
    *MODEL_FLAGS,
    Flag(("--host",), "host", str, _DEFAULTS.host, "LLAMA_ARG_HOST", "address to listen on"),
    Flag(("--port",), "port", int, _DEFAULTS.port, "LLAMA_ARG_PORT", "port to listen on"),
    Flag(
        ("-c", "--ctx-size"),
        "ctx_size",
        int,
        _DEFAULTS.ctx_size,
        "LLAMA_ARG_CTX_SIZE",
        "context window in tokens (default: the model's maximum)",
    ),
    Flag(
        ("-np", "--parallel"),
        "parallel",
        int,
        _DEFAULTS.parallel,
        "LLAMA_ARG_N_PARALLEL",
        "generation slots: sequences decoded together in one batch",
    ),
    Flag(
        ("--max-queue-depth",),
        "max_queue_depth",
        int,
        _DEFAULTS.max_queue_depth,
        "MLXCEL_MAX_QUEUE_DEPTH",
        "requests that may wait for a free slot; more get 503",
    ),
    Flag(
        ("--prefill-step-size",),
        "prefill_step_size",
        int,
        _DEFAULTS.prefill_step_size,
        "MLXCEL_PREFILL_STEP_SIZE",
        "prompt tokens one engine step reads at most, all prompts together",
    ),
    Flag(
        ("--max-step-ms",),
        "max_step_ms",
        float,
        _DEFAULTS.max_step_ms,
        "MLXCEL_MAX_STEP_MS",
        "milliseconds a step that reads prompts may last while streams decode (bounds their "
        "inter-token gap); 0 derives it as 1.5 times a full batch's decode step",
    ),
    Flag(
        ("--prompt-cache-bytes",),
        "prompt_cache_bytes",
        int,
        _DEFAULTS.prompt_cache_bytes,
        "MLXCEL_PROMPT_CACHE_BYTES",
        "bytes of KV state kept so later prompts that start alike (follow-up turns, shared "
        "instructions) skip prefilling that part; counts the live sequences too; 0 disables",
    ),
    Flag(
        ("--tool-call-parser",),
        "tool_call_parser",
        str,
        _DEFAULTS.tool_call_parser,
        "MLXCEL_TOOL_CALL_PARSER",
        "tool-call format the model writes: hermes, mistral, llama3_json, qwen3_coder, "
        "functionary or pythonic (default: picked from the model's chat template)",
    ),
    Flag(
        ("--sse-keepalive-secs",),
        "sse_keepalive_secs",
        float,
        _DEFAULTS.sse_keepalive_secs,
        "MLXCEL_SSE_KEEPALIVE_SECS",
        "idle seconds before a stream sends a keep-alive (an `mlx.progress` event)",
    ),
    Flag(
        ("--websocket-idle-secs",),
        "websocket_idle_secs",
        float,
        _DEFAULTS.websocket_idle_secs,
        "MLXCEL_WEBSOCKET_IDLE_SECS",
        "seconds a `/v1/responses` WebSocket may stay silent with no response running "
        "before the server closes it",
    ),
    Flag(
        ("--no-progress-events",),
        "no_progress_events",
        switch,
        not _DEFAULTS.progress_events,
        "MLXCEL_NO_PROGRESS_EVENTS",
        "send keep-alives as SSE comments, not as `mlx.progress` events (queue place and "
        "prompt tokens read, which clients that give up on a silent stream count)",
    ),
    Flag(
        ("--send-timeout-secs",),
        "send_timeout_secs",
        float,
        _DEFAULTS.send_timeout_secs,
        "MLXCEL_SEND_TIMEOUT_SECS",
        "seconds a slot waits on a client that has left a whole response's events unread "
        "before treating it as gone (its slot is freed)",
    ),
    Flag(
        ("--shutdown-timeout-secs",),
        "shutdown_timeout_secs",
        float,
        _DEFAULTS.shutdown_timeout_secs,
        "MLXCEL_SHUTDOWN_TIMEOUT_SECS",
        "on SIGTERM/SIGINT, seconds in-flight responses get to finish before they are ended "
        "(a second signal exits at once)",
    ),
    Flag(
        ("--body-timeout-secs",),
        "body_timeout_secs",
        float,
        _DEFAULTS.body_timeout_secs,
        "MLXCEL_BODY_TIMEOUT_SECS",
        "seconds a request body may take to arrive whole",
    ),
    Flag(
        ("--read-timeout-secs",),
        "read_timeout_secs",
        float,
        _DEFAULTS.read_timeout_secs,
        "MLXCEL_READ_TIMEOUT_SECS",
        "seconds a connection may take to send a request's headers",
    ),
    Flag(
        ("--max-connections",),
        "max_connections",
        int,
        _DEFAULTS.max_connections,
        "MLXCEL_MAX_CONNECTIONS",
        "open HTTP connections served at once; more wait in the listen backlog",
    ),
    Flag(
        ("--api-key",),
        "api_key",
        str,
        None,
        "LLAMA_API_KEY",
        "require `Authorization: Bearer KEY`; repeat it or comma-separate several keys "
        "(combined with the variable's and the keys file's)",
        repeat=True,
    ),
    Flag(
        ("--api-key-file",),
        "api_key_file",
        Path,
        _DEFAULTS.api_key_file,
        "MLXCEL_API_KEY_FILE",
        "file of API keys, one a line as `KEY` or `NAME:KEY`, optionally followed by "
        "`rpm=N tpm=N daily=N admin=true`; read again on SIGHUP",
    ),
    Flag(
        ("--admin-key",),
        "admin_key",
        str,
        None,
        "MLXCEL_ADMIN_KEY",
        "an API key that may also load and unload models (as may `admin=true` keys of the "
        "keys file); with any keys, no other key may; repeat it or comma-separate several",
        repeat=True,
    ),
    Flag(
        ("--admin-rate-limit-rpm",),
        "admin_rate_limit_rpm",
        int,
        _DEFAULTS.admin_rate_limit_rpm,
        "MLXCEL_ADMIN_RATE_LIMIT_RPM",
        "model loads and unloads each admin key may ask for a minute (429 beyond); 0 = no limit",
    ),
    Flag(
        ("--access-log",),
        "access_log",
        switch,
        _DEFAULTS.access_log,
        "MLXCEL_ACCESS_LOG",
        "log one line per request at INFO on `mlxcel.access` (method, path, status, ms, "
        "response id, key name, tokens); --no-access-log turns it off",
        negatable=True,
    ),
    Flag(
        ("--cors-origins",),
        "cors_origins",
        str,
        None,
        "MLXCEL_CORS_ORIGINS",
        "comma-separated origins (`https://app.example`) whose web pages may call the API, "
        "or `*` for any; unset, no CORS headers are sent",
    ),
    Flag(
        ("--metrics-public",),
        "metrics_public",
        switch,
        _DEFAULTS.metrics_public,
        "MLXCEL_METRICS_PUBLIC",
        "serve /metrics without the API key (for a Prometheus scraper)",
    ),
    Flag(
        ("--rate-limit-rpm",),
        "rate_limit_rpm",
        int,
        _DEFAULTS.rate_limit_rpm,
        "MLXCEL_RATE_LIMIT_RPM",
        "requests a minute each API key may start (responses, chat and text completions); "
        "counted in the store, so replicas sharing one share it; 0 = no limit",
    ),
    Flag(
        ("--rate-limit-tpm",),
        "rate_limit_tpm",
        int,
        _DEFAULTS.rate_limit_tpm,
        "MLXCEL_RATE_LIMIT_TPM",
        "input + output tokens a minute each API key may spend; a key past it is refused "
        "until the minute ends; 0 = no limit",
    ),
    Flag(
        ("--daily-token-quota",),
        "daily_token_quota",
        int,
        _DEFAULTS.daily_token_quota,
        "MLXCEL_DAILY_TOKEN_QUOTA",
        "input + output tokens each API key may spend in a UTC day; 0 = no quota",
    ),
    Flag(
        ("--store",),
        "store",
        str,
        _DEFAULTS.store,
        "MLXCEL_STORE",
        "where stored responses, conversations and background jobs live: memory, "
        "sqlite[:PATH] to keep them across restarts (default path: the user data folder), "
        "or redis://HOST:PORT/DB (rediss:// for TLS) to share them between replicas",
    ),
    Flag(
        ("--redis-key-prefix",),
        "redis_key_prefix",
        str,
        _DEFAULTS.redis_key_prefix,
        "MLXCEL_REDIS_KEY_PREFIX",
        "what every key of a Redis store begins with (replicas sharing state use the same)",
    ),
    Flag(
        ("--replica-lease-secs",),
        "replica_lease_secs",
        float,
        _DEFAULTS.replica_lease_secs,
        "MLXCEL_REPLICA_LEASE_SECS",
        "on a Redis store: seconds a replica's lease lasts without renewal; a stopped "
        "replica's background responses end failed about this long after it stops",
    ),
    Flag(
        ("--responses-store-max-entries",),
        "responses_store_max_entries",
        int,
        _DEFAULTS.responses.max_entries,
        "LLAMA_ARG_RESPONSES_STORE_MAX_ENTRIES",
        "stored responses kept; 0 disables storage",
    ),
    Flag(
        ("--responses-store-max-bytes",),
        "responses_store_max_bytes",
        int,
        _DEFAULTS.responses.max_bytes,
        "MLXCEL_RESPONSES_STORE_MAX_BYTES",
        "rough budget of retained response JSON bytes; 0 evicts at once",
    ),
    Flag(
        ("--responses-store-ttl-secs",),
        "responses_store_ttl_secs",
        float,
        _DEFAULTS.responses.ttl_secs,
        "LLAMA_ARG_RESPONSES_STORE_TTL_SECS",
        "seconds a stored response lives; 0 = no expiry",
    ),
    Flag(
        ("--responses-background-max-jobs", "--max-jobs"),
        "background_max_jobs",
        int,
        _DEFAULTS.background_max_jobs,
        "MLXCEL_RESPONSES_BACKGROUND_MAX_JOBS",
        "concurrently active background responses; 0 disables background mode",
    ),
    Flag(
        ("--responses-background-ephemeral-ttl-secs",),
        "background_ephemeral_ttl_secs",
        float,
        _DEFAULTS.background_ephemeral_ttl_secs,
        "MLXCEL_RESPONSES_BACKGROUND_EPHEMERAL_TTL_SECS",
        "seconds the result of a `background, store: false` request stays pollable (>= 1)",
    ),
    Flag(
        ("--max-events-per-response",),
        "max_events_per_response",
        int,
        _DEFAULTS.max_events_per_response,
        "MLXCEL_MAX_EVENTS_PER_RESPONSE",
        "events kept in a background response's log for resuming its stream; 0 keeps none",
    ),
    Flag(
        ("--conversation-store-max-entries",),
        "conversation_store_max_entries",
        int,
        _DEFAULTS.conversations.max_entries,
        "LLAMA_ARG_CONVERSATION_STORE_MAX_ENTRIES",
        "conversation transcripts kept; 0 disables",
    ),
    Flag(
        ("--conversation-store-max-bytes",),
        "conversation_store_max_bytes",
        int,
        _DEFAULTS.conversations.max_bytes,
        "MLXCEL_CONVERSATION_STORE_MAX_BYTES",
        "rough budget of retained transcript JSON bytes; 0 evicts at once",
    ),
    Flag(
        ("--conversation-store-ttl-secs",),
        "conversation_store_ttl_secs",
        float,
        _DEFAULTS.conversations.ttl_secs,
        "LLAMA_ARG_CONVERSATION_STORE_TTL_SECS",
        "seconds a transcript lives; 0 = no expiry",
    ),
    Flag(
        ("--reasoning-echo-max-bytes",),
        "reasoning_echo_max_bytes",
        int,
        _DEFAULTS.reasoning_echo_max_bytes,
        "MLXCEL_REASONING_ECHO_MAX_BYTES",
        "bytes of returned reasoning remembered to put back into turns a client resends "
        "without it (LRU); 0 disables",
    ),
    Flag(
        ("--hosted-tools",),
        "hosted_tools",
        str,
        _DEFAULTS.hosted_tools,
        "MLXCEL_HOSTED_TOOLS",
        "hosted tool types in a request (web_search, file_search, mcp, ...), which this "
        "server cannot run: reject answers 400, ignore drops them from what the model sees",
    ),
    Flag(
        ("--images",),
        "images",
        str,
        _DEFAULTS.images,
        "MLXCEL_IMAGES",
        "input images for a model without vision: placeholder has the model read a short "
        "note for each image, reject answers 400",
    ),
    Flag(
        ("--log-level",),
        "log_level",
        str,
        "info",
        "MLXCEL_LOG_LEVEL",
        "debug, info, warning or error",
    ),
)
