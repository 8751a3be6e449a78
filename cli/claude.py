"""`mlxcel claude-config`: the environment Claude Code needs for a server started with the
same flags.

Claude Code reads an `env` block from its settings file, `$CLAUDE_CONFIG_DIR/settings.json`
(default `~/.claude/settings.json`). The block points it at this server's Anthropic
Messages API and names the served model for every tier it asks for (main, Opus, Sonnet,
Haiku/small-fast, subagents), so it needs no `--model-alias` on the server; it also turns
off what would defeat the prompt cache (the per-request billing nonce in `system`) or
reach beyond the server (telemetry, error reports, update checks). With `--write` it is
merged into that file: every other key, and every other variable of `env`, is kept, and
running it again changes nothing.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from mlxcel.cli.codex import url_host
from mlxcel.cli.config_file import replace_text
from mlxcel.cli.flags import add_serve_flags, settings_from_args
from mlxcel.config import Settings
from mlxcel.errors import ConfigError, MlxcelError

API_KEY_ENV = "MLXCEL_API_KEY"
"""Where the key Claude Code should send is read from when the server requires one."""
NO_KEY = "no-key"
"""Claude Code will not start without a credential ("Not logged in"); a server without
keys ignores the token, so any value does."""
API_TIMEOUT_MS = 30 * 60 * 1000
"""Claude Code's own limit on one request (10 minutes by default): a first turn's prompt
takes minutes to read on a small CPU, so it gets the same half hour Codex gets."""
TIERS = (
    "ANTHROPIC_MODEL",
    "ANTHROPIC_DEFAULT_OPUS_MODEL",
    "ANTHROPIC_DEFAULT_SONNET_MODEL",
    "ANTHROPIC_DEFAULT_HAIKU_MODEL",
    "ANTHROPIC_SMALL_FAST_MODEL",  # the Haiku tier's older name, still read
    "CLAUDE_CODE_SUBAGENT_MODEL",
)
"""Every variable by which Claude Code picks the model of a request."""
FIXED = {
    "CLAUDE_CODE_ATTRIBUTION_HEADER": "0",  # no `x-anthropic-billing-header` nonce line
    "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",  # no telemetry, reports, updates
    "API_TIMEOUT_MS": str(API_TIMEOUT_MS),
}


def claude_env(
    settings: Settings, base_url: str | None, environ: Mapping[str, str]
) -> dict[str, str]:
    """The variables for Claude Code, in a stable order."""
    url = base_url or f"http://{url_host(settings.host)}:{settings.port}"
    url = url.rstrip("/").removesuffix("/v1")  # Claude Code adds `/v1/messages` itself
    alias = served_alias(settings)
    return {
        "ANTHROPIC_BASE_URL": url,
        "ANTHROPIC_AUTH_TOKEN": auth_token(settings, environ),
        **{name: alias for name in TIERS},
        **FIXED,
    }


def auth_token(settings: Settings, environ: Mapping[str, str]) -> str:
    """The key Claude Code sends as `Authorization: Bearer`: `$MLXCEL_API_KEY`, else the
    first `--api-key`; a server with only a keys file or admin keys names none (an admin
    key is not handed out)."""
    if not (settings.api_keys or settings.admin_keys) and settings.api_key_file is None:
        return NO_KEY
    key = environ.get(API_KEY_ENV, "").strip() or next(iter(settings.api_keys), "")
    if not key:
        raise ConfigError(
            f"the server requires an API key: export {API_KEY_ENV}=KEY (the key Claude Code "
            "should send) and run this again"
        )
    return key


def served_alias(settings: Settings) -> str:
    """The name the server answers to (`--alias`, else the model folder's name)."""
    from mlxcel.cli.serve import DEFAULT_ALIAS, resolve_model

    try:
        return resolve_model(settings)[1].alias
    except (MlxcelError, OSError):  # not fetched yet: the name it will have
        return settings.alias or (settings.model.name if settings.model else DEFAULT_ALIAS)


def render(env: Mapping[str, str]) -> str:
    """A settings file holding only `env`."""
    return merge("", env)


def merge(existing: str, env: Mapping[str, str]) -> str:
    """`existing` (a settings file's text) with `env` set in its `env` block: other keys
    and variables are kept in their order, ours take their values."""
    try:
        settings: Any = json.loads(existing) if existing.strip() else {}
    except json.JSONDecodeError as exc:
        raise ConfigError(
            f"the Claude Code settings are not valid JSON ({exc}); fix it first"
        ) from exc
    if not isinstance(settings, dict):
        raise ConfigError("the Claude Code settings are not a JSON object; fix them first")
    block = settings.setdefault("env", {})
    if not isinstance(block, dict):
        raise ConfigError("the Claude Code settings' `env` is not an object; fix it first")
    block.update(env)
    return json.dumps(settings, indent=2, ensure_ascii=False) + "\n"


def settings_path(environ: Mapping[str, str]) -> Path:
    folder = environ.get("CLAUDE_CONFIG_DIR") or Path.home() / ".claude"
    return Path(folder).expanduser() / "settings.json"


def write(path: Path, env: Mapping[str, str]) -> None:
    """Merge `env` into the settings file at `path` (created if missing), replaced
    atomically, readable by its owner only (it may hold the key)."""
    existing = path.read_text() if path.is_file() else ""
    replace_text(path, merge(existing, env), private=True)


def build_parser(environ: Mapping[str, str]) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="mlxcel claude-config",
        description="Print the Claude Code settings (its `env` block) for an mlxcel server "
        "started with the same flags; with --write, merge them into "
        "$CLAUDE_CONFIG_DIR/settings.json (default ~/.claude/settings.json).",
    )
    parser.add_argument(
        "--base-url",
        help="the server's URL as Claude Code reaches it (default: from --host/--port)",
    )
    parser.add_argument(
        "--write", action="store_true", help="merge into Claude Code's settings.json"
    )
    add_serve_flags(parser, dict(environ))
    return parser


def main(argv: Sequence[str], environ: Mapping[str, str] | None = None) -> int:
    environ = os.environ if environ is None else environ
    try:
        args = build_parser(environ).parse_args(argv)
        settings = settings_from_args(args)
        env = claude_env(settings, args.base_url, environ)
        if args.write:
            target = settings_path(environ)
            write(target, env)
            print(f"wrote the mlxcel environment to {target}", file=sys.stderr)
        else:
            print(render(env), end="")
    except ConfigError as exc:
        print(f"mlxcel claude-config: error: {exc.message}", file=sys.stderr)
        return 2
    _alias_hint(settings, env["ANTHROPIC_MODEL"])
    return 0


def _alias_hint(settings: Settings, alias: str) -> None:
    """Claude Code names the served model on its own; a Claude model a user names by hand
    (`claude --model claude-…`) reaches it only through an alias on the server."""
    from mlxcel.generation import ModelNames

    patterns = tuple(p for p, _ in settings.model_aliases)
    if not ModelNames(alias, alias, patterns).matches("claude-any"):
        print(
            f"Claude Code asks for {alias!r}; for `claude --model claude-…` names, start the "
            f"server with --model-alias 'claude-*={alias}'.",
            file=sys.stderr,
        )
