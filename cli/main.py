"""Command line: `mlxcel serve ...`, `mlxcel fetch-model ...` and `mlxcel-server ...`.

`mlxcel serve` and `mlxcel-server` take one flag set (`cli/flags.py`), named as llama-server
names them; each flag may also come from an environment variable, and a flag given on the
command line wins over its variable.
"""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Callable, Sequence

from mlxcel import __version__
from mlxcel.cli.flags import build_parser, settings_from_args
from mlxcel.config import Settings
from mlxcel.errors import ConfigError


def _serve(prog: str, argv: Sequence[str], serve: Callable[[Settings], None] | None = None) -> int:
    """Parse the serve flags and `serve` them (by default `mlxcel.cli.serve.run`, the real
    model's server); a configuration error is one `PROG: error: ...` line and exit 2."""
    environ = dict(os.environ)
    try:
        parser = build_parser(prog, environ)
        args = parser.parse_args(argv)
        settings = settings_from_args(args)
    except ConfigError as exc:
        print(f"{prog}: error: {exc.message}", file=sys.stderr)
        return 2
    logging.basicConfig(
        level=args.log_level.upper(),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    if serve is None:
        from mlxcel.cli.serve import run

        serve = run

    try:
        serve(settings)
    except ConfigError as exc:
        print(f"{prog}: error: {exc.message}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 0
    return 0


def server_main(argv: Sequence[str] | None = None) -> int:
    """`mlxcel-server [flags]`."""
    return _serve("mlxcel-server", sys.argv[1:] if argv is None else argv)


def main(argv: Sequence[str] | None = None) -> int:
    """`mlxcel serve [flags]` and `mlxcel fetch-model [...]`."""
    args = list(sys.argv[1:] if argv is None else argv)
    commands = "serve, fetch-model, codex-config, claude-config"
    if not args or args[0] in ("-h", "--help"):
        print(
            "usage: mlxcel {serve,fetch-model,codex-config,claude-config} ...\n\n"
            "  serve          serve the Responses API (same flags as mlxcel-server)\n"
            "  fetch-model    obtain and convert the embedded default model once\n"
            "  codex-config   the Codex CLI config for a server with the same flags "
            "(--write merges it)\n"
            "  claude-config  the Claude Code settings for a server with the same flags "
            "(--write merges them)\n"
        )
        return 0 if args else 2
    if args[0] == "--version":
        print(f"mlxcel {__version__}")
        return 0
    if args[0] == "serve":
        return _serve("mlxcel serve", args[1:])
    if args[0] == "fetch-model":
        from mlxcel.model.provision.fetch import main as fetch_main

        return int(fetch_main(args[1:]))
    if args[0] == "codex-config":
        from mlxcel.cli.codex import main as codex_config_main

        return codex_config_main(args[1:])
    if args[0] == "claude-config":
        from mlxcel.cli.claude import main as claude_config_main

        return claude_config_main(args[1:])
    print(f"mlxcel: unknown command {args[0]!r} (commands: {commands})", file=sys.stderr)
    return 2
