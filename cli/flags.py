"""The serve flag set, named as llama-server names them, shared by `mlxcel serve`,
`mlxcel-server` and `mlxcel codex-config`.

Each flag may also come from an environment variable; a flag given on the command line
wins over its variable. Each flag's default is its setting's (`config.py`).
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from mlxcel import __version__
from mlxcel.cli.flag_table import FLAGS, Flag, switch
from mlxcel.cli.prompt_cache import PROMPT_CACHE_FLAGS
from mlxcel.cli.webhook_flags import WEBHOOK_FLAGS
from mlxcel.config import Settings, StoreLimits
from mlxcel.errors import ConfigError


def _env_default(flag: Flag, environ: dict[str, str]) -> Any:
    if flag.env is None or flag.env not in environ:
        return flag.default
    raw = environ[flag.env]
    try:
        return flag.kind(raw)
    except ValueError as exc:
        raise ConfigError(f"{flag.env}={raw!r} is not valid for {flag.names[-1]}") from exc


def build_parser(prog: str, environ: dict[str, str]) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=prog,
        description="Serve a local MLX language model behind the OpenAI Responses API.",
        epilog="Every flag can also be set by the environment variable named in its help; "
        "a flag on the command line wins.",
    )
    add_serve_flags(parser, environ)
    return parser


def add_serve_flags(parser: argparse.ArgumentParser, environ: dict[str, str]) -> None:
    for flag in (*FLAGS, *WEBHOOK_FLAGS, *PROMPT_CACHE_FLAGS):
        env_note = f" [env {flag.env}]" if flag.env else ""
        default_note = "" if flag.default is None else f" (default: {flag.default})"
        if flag.negatable:
            parser.add_argument(
                *flag.names,
                dest=flag.dest,
                action=argparse.BooleanOptionalAction,
                default=_env_default(flag, environ),
                help=f"{flag.help}{env_note}",
            )
            continue
        if flag.repeat:
            from_env = _env_default(flag, environ)
            parser.add_argument(
                *flag.names,
                dest=flag.dest,
                action="append",
                type=flag.kind,
                default=[] if from_env is None else [from_env],
                help=f"{flag.help}{env_note}",
            )
            continue
        if flag.kind is switch:
            default = _env_default(flag, environ)
            parser.add_argument(
                *flag.names,
                dest=flag.dest,
                action="store_true",
                default=default,
                help=f"{flag.help}{env_note}",
            )
            continue
        parser.add_argument(
            *flag.names,
            dest=flag.dest,
            type=flag.kind,
            default=_env_default(flag, environ),
            help=f"{flag.help}{default_note}{env_note}",
        )
    parser.add_argument("--version", action="version", version=f"mlxcel {__version__}")


def model_aliases(values: list[str]) -> tuple[tuple[str, str], ...]:
    """The `(PATTERN, NAME)` pairs of the `--model-alias` values (each may hold several,
    comma-separated), split at the first `=`: a glob has no use for one."""
    pairs = []
    for value in values:
        for part in (p.strip() for p in value.split(",")):
            if not part:
                continue
            pattern, equals, name = part.partition("=")
            if not equals:
                raise ConfigError(f"--model-alias {part!r}: expected PATTERN=NAME")
            pairs.append((pattern.strip(), name.strip()))
    return tuple(pairs)


def model_flags(values: list[str]) -> tuple[Path | None, tuple[tuple[str, Path], ...]]:
    """The `--model` values: a first one without a name (a bare path, served under
    `--alias` or its folder's name, as a single model always was), and the `NAME=PATH`
    ones in order. A value is named when it has a `=` with no `/` before it."""
    bare: Path | None = None
    named: list[tuple[str, Path]] = []
    for i, value in enumerate(values):
        name, equals, path = value.partition("=")
        if equals and name.strip() and "/" not in name and path.strip():
            named.append((name.strip(), Path(path.strip())))
        elif i == 0:
            bare = Path(value)
        else:
            raise ConfigError(f"--model {value}: give each further model a name (NAME=PATH)")
    return bare, tuple(named)


def settings_from_args(args: argparse.Namespace) -> Settings:
    keys = _comma_separated(args.api_key)
    origins = tuple(o.strip() for o in (args.cors_origins or "").split(",") if o.strip())
    return Settings(
        **_model_fields(args),
        host=args.host,
        port=args.port,
        ctx_size=args.ctx_size,
        parallel=args.parallel,
        max_queue_depth=args.max_queue_depth,
        prefill_step_size=args.prefill_step_size,
        max_step_ms=args.max_step_ms,
        prompt_cache_bytes=args.prompt_cache_bytes,
        prompt_cache_dir=args.prompt_cache_dir,
        prompt_cache_disk_bytes=args.prompt_cache_disk_bytes,
        tool_call_parser=args.tool_call_parser,
        sse_keepalive_secs=args.sse_keepalive_secs,
        progress_events=not args.no_progress_events,
        api_keys=keys,
        api_key_file=args.api_key_file,
        admin_keys=_comma_separated(args.admin_key),
        admin_rate_limit_rpm=args.admin_rate_limit_rpm,
        access_log=args.access_log,
        cors_origins=origins,
        store=args.store,
        redis_key_prefix=args.redis_key_prefix,
        replica_lease_secs=args.replica_lease_secs,
        responses=StoreLimits(
            args.responses_store_max_entries,
            args.responses_store_max_bytes,
            args.responses_store_ttl_secs,
        ),
        conversations=StoreLimits(
            args.conversation_store_max_entries,
            args.conversation_store_max_bytes,
            args.conversation_store_ttl_secs,
        ),
        background_max_jobs=args.background_max_jobs,
        background_ephemeral_ttl_secs=args.background_ephemeral_ttl_secs,
        max_events_per_response=args.max_events_per_response,
        reasoning_echo_max_bytes=args.reasoning_echo_max_bytes,
        send_timeout_secs=args.send_timeout_secs,
        shutdown_timeout_secs=args.shutdown_timeout_secs,
        body_timeout_secs=args.body_timeout_secs,
        read_timeout_secs=args.read_timeout_secs,
        max_connections=args.max_connections,
        hosted_tools=args.hosted_tools,
        images=args.images,
        metrics_public=args.metrics_public,
        rate_limit_rpm=args.rate_limit_rpm,
        rate_limit_tpm=args.rate_limit_tpm,
        daily_token_quota=args.daily_token_quota,
        webhook_url=args.webhook_url,
        webhook_secret=args.webhook_secret,
        webhook_max_attempts=args.webhook_max_attempts,
        webhook_timeout_secs=args.webhook_timeout_secs,
        webhook_backoff_secs=args.webhook_backoff_secs,
        webhook_max_pending_per_key=args.webhook_max_pending_per_key,
    )


def _comma_separated(values: list[str]) -> tuple[str, ...]:
    """A repeatable flag's values, each of which may hold several, comma-separated."""
    return tuple(part.strip() for value in values for part in value.split(",") if part.strip())


def _model_fields(args: argparse.Namespace) -> dict[str, Any]:
    """The settings of the served models (`--model`, aliases, loading and pinning)."""
    model, named = model_flags(args.model)
    return {
        "model": model,
        "alias": args.alias,
        "model_aliases": model_aliases(args.model_alias),
        "named_models": named,
        "models_dir": args.models_dir,
        "max_loaded_models": args.max_loaded_models,
        "idle_unload_secs": args.idle_unload_secs,
        "pinned_models": tuple(p.strip() for v in args.pin for p in v.split(",") if p.strip()),
    }
