"""A server process on the fake engine, started with the real command line's flags.

    python tests/helpers/fake_server_main.py [--fake-step-delay SECONDS] [--fake-hold WORD]
        [mlxcel-server flags]

Every server flag (`--store`, the store limits, `--parallel`, ...) goes through the
command line's own parsing and error handling (`mlxcel.cli.main`), and the server runs as
`mlxcel-server` runs it, signals included; only the model is the deterministic fake
engine (`mlxcel.model.fake`), whose steps last `--fake-step-delay` seconds each. With
`--fake-hold WORD`, replies that have WORD are held after their first word (the engine's
gate) until the process gets SIGUSR1, so tests can hold a job in flight for as long as
they need.
"""

from __future__ import annotations

import argparse
import functools
import signal
import sys

from mlxcel.cli.main import _serve
from mlxcel.cli.serve import serve_until_signalled
from mlxcel.config import Settings
from mlxcel.generation import ModelNames
from mlxcel.model.fake import FakeEngine, fake_factory

PROG = "fake-server"
MODEL = "fake-model"
CONTEXT_LENGTH = 65536


def serve_fake(settings: Settings, step_delay: float, hold: str | None) -> None:
    """Serve `settings` on a fake engine until SIGINT or SIGTERM (SIGUSR1 releases a
    held engine)."""
    engine = FakeEngine(step_delay=step_delay)
    if hold is not None:
        engine.hold(on=hold)
        signal.signal(signal.SIGUSR1, lambda signum, frame: engine.release())
    factory = functools.partial(fake_factory, engine, CONTEXT_LENGTH)
    names = ModelNames(MODEL, "/models/fake")
    serve_until_signalled(settings, factory, names)


def main(argv: list[str]) -> int:
    own = argparse.ArgumentParser(add_help=False)
    own.add_argument("--fake-step-delay", type=float, default=0.0)
    own.add_argument("--fake-hold", default=None)
    mine, rest = own.parse_known_args(argv)
    serve = functools.partial(serve_fake, step_delay=mine.fake_step_delay, hold=mine.fake_hold)
    return _serve(PROG, rest, serve)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
