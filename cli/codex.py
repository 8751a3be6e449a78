"""`mlxcel codex-config`: the Codex CLI's `config.toml` for a server started with the same flags.

Codex reads `$CODEX_HOME/config.toml` (default `~/.codex`). The block names this server as a
model provider speaking the Responses API, with a stream idle timeout that fits a slow
prefill, and makes it the default provider. With `--write` it is merged into that file:
every other key and comment is kept, and running it again changes nothing.
"""

from __future__ import annotations

import argparse
import os
import sys
import tomllib
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import tomlkit

from mlxcel.cli.config_file import replace_text
from mlxcel.cli.flags import add_serve_flags, settings_from_args
from mlxcel.config import Settings
from mlxcel.errors import ConfigError, MlxcelError

PROVIDER = "mlxcel"
API_KEY_ENV = "MLXCEL_API_KEY"
"""The variable Codex reads the server's `--api-key` from (`env_key`)."""
STREAM_IDLE_TIMEOUT_MS = 30 * 60 * 1000
"""A first turn's prompt takes minutes to read on a small CPU; progress events arrive at
every keep-alive interval, so this only bounds a server that stopped answering."""
STREAM_MAX_RETRIES = 2
REQUEST_MAX_RETRIES = 4
"""A full waiting line answers 503 at once; a retry a moment later usually gets in."""


def codex_values(settings: Settings, base_url: str | None) -> dict[str, Any]:
    """The top-level keys and the provider table, as plain TOML values."""
    alias, window = model_names(settings)
    provider: dict[str, Any] = {
        "name": "mlxcel",
        "base_url": base_url or f"http://{url_host(settings.host)}:{settings.port}/v1",
        "wire_api": "responses",
    }
    if settings.api_keys or settings.admin_keys or settings.api_key_file is not None:
        provider["env_key"] = API_KEY_ENV
    provider |= {
        "stream_idle_timeout_ms": STREAM_IDLE_TIMEOUT_MS,
        "stream_max_retries": STREAM_MAX_RETRIES,
        "request_max_retries": REQUEST_MAX_RETRIES,
    }
    values: dict[str, Any] = {"model": alias, "model_provider": PROVIDER}
    if window is not None:
        values["model_context_window"] = window
    values["web_search"] = "disabled"  # a hosted tool this server does not run
    return values | {"model_providers": {PROVIDER: provider}}


def model_names(settings: Settings) -> tuple[str, int | None]:
    """The alias clients call the model by and its context window (None when the model
    folder cannot be read yet: Codex then uses its own default)."""
    from mlxcel.cli.serve import DEFAULT_ALIAS, resolve_model
    from mlxcel.model.folder import context_length

    try:
        path, names = resolve_model(settings)
        window = settings.ctx_size or context_length(path)
    except (MlxcelError, OSError, ValueError) as exc:
        print(f"mlxcel codex-config: no context window: {exc}", file=sys.stderr)
        fallback = settings.alias or (settings.model.name if settings.model else DEFAULT_ALIAS)
        return fallback, settings.ctx_size
    return names.alias, window


def url_host(host: str) -> str:
    """`--host` as a client on this machine writes it in a URL."""
    if host in ("0.0.0.0", "::", ""):  # listening everywhere: reach it locally
        return "127.0.0.1"
    return f"[{host}]" if ":" in host else host


def render(values: Mapping[str, Any]) -> str:
    """A fresh `config.toml` holding only `values`."""
    return merge("", values)


def merge(existing: str, values: Mapping[str, Any]) -> str:
    """`existing` with `values` set: other keys, tables and comments are kept; our provider
    table is replaced whole, so a rerun gives the same text."""
    try:
        tomllib.loads(existing)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"the Codex config is not valid TOML ({exc}); fix it first") from exc
    doc = tomlkit.parse(existing)
    for key, value in values.items():
        if key != "model_providers":
            doc[key] = value
    providers = doc.get("model_providers")
    if providers is None:
        providers = tomlkit.table(is_super_table=True)
        doc["model_providers"] = providers
    for name, table in values["model_providers"].items():
        fresh = tomlkit.table()
        fresh.update(table)
        providers[name] = fresh
    return tomlkit.dumps(doc)


def codex_home(environ: Mapping[str, str]) -> Path:
    return Path(environ.get("CODEX_HOME") or Path.home() / ".codex").expanduser()


def write(path: Path, values: Mapping[str, Any]) -> None:
    """Merge `values` into the file at `path` (created if missing), replaced atomically."""
    existing = path.read_text() if path.is_file() else ""
    replace_text(path, merge(existing, values))


def build_parser(environ: Mapping[str, str]) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="mlxcel codex-config",
        description="Print the Codex CLI config.toml block for an mlxcel server started with "
        "the same flags; with --write, merge it into $CODEX_HOME/config.toml "
        "(default ~/.codex) and make it the default provider.",
    )
    parser.add_argument(
        "--base-url", help="the server's URL as Codex reaches it (default: from --host/--port)"
    )
    parser.add_argument("--write", action="store_true", help="merge into $CODEX_HOME/config.toml")
    add_serve_flags(parser, dict(environ))
    return parser


def main(argv: Sequence[str], environ: Mapping[str, str] | None = None) -> int:
    environ = os.environ if environ is None else environ
    try:
        args = build_parser(environ).parse_args(argv)
        values = codex_values(settings_from_args(args), args.base_url)
        if args.write:
            target = codex_home(environ) / "config.toml"
            write(target, values)
            print(f"wrote the mlxcel provider to {target}", file=sys.stderr)
        else:
            print(render(values), end="")
    except ConfigError as exc:
        print(f"mlxcel codex-config: error: {exc.message}", file=sys.stderr)
        return 2
    if "env_key" in values["model_providers"][PROVIDER]:
        print(f"Codex sends the key from ${API_KEY_ENV}: export it first.", file=sys.stderr)
    return 0
