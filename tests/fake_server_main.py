"""A server process on the fake engine, started with the real command line's flags.

    python tests/fake_server_main.py [--fake-step-delay SECONDS] [mlxcel-server flags]

Every server flag (`--store`, the store limits, `--parallel`, ...) goes through the
command line's own parsing (`mlxcel.flags`) and the real server runs them, signals
included; only the model is the deterministic fake engine (`mlxcel.model.fake`), whose
steps last `--fake-step-delay` seconds each, so tests can hold a job in flight. A bad
flag prints `PROG: error: ...` and exits 2, as `mlxcel-server` does.
"""

from __future__ import annotations

import argparse
import functools
import logging
import os
import sys
from collections.abc import Sequence

import trio

from mlxcel.app import _serve_until_signalled
from mlxcel.config import Settings
from mlxcel.errors import ConfigError
from mlxcel.flags import build_parser, settings_from_args
from mlxcel.model.fake import FakeEngine, fake_factory
from mlxcel.prepare.intake import ModelNames

PROG = "fake-server"
MODEL = "fake-model"
CONTEXT_LENGTH = 65536


def _run(settings: Settings, step_delay: float) -> None:
    factory = functools.partial(fake_factory, FakeEngine(step_delay=step_delay), CONTEXT_LENGTH)
    names = ModelNames(MODEL, "/models/fake")
    trio.run(functools.partial(_serve_until_signalled, settings, factory, names))


def main(argv: Sequence[str]) -> int:
    own = argparse.ArgumentParser(add_help=False)
    own.add_argument("--fake-step-delay", type=float, default=0.0)
    mine, rest = own.parse_known_args(argv)
    try:
        args = build_parser(PROG, dict(os.environ)).parse_args(rest)
        settings = settings_from_args(args)
        logging.basicConfig(
            level=args.log_level.upper(),
            format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        )
        _run(settings, mine.fake_step_delay)
    except ConfigError as exc:
        print(f"{PROG}: error: {exc.message}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
