"""End to end with the real Codex CLI (pinned; installed by `codex_cli` on first use).

Codex gets a fresh `CODEX_HOME` holding only what `mlxcel codex-config --write` produced,
and an environment in which only 127.0.0.1 is reachable (every proxy variable points at
a closed local port, loopback excepted).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import trio

from mlxcel.model.fake import FakeEngine

from codex_cli import codex_executable
from support import RealServer, StartServer, start_server

pytestmark = pytest.mark.e2e

CLOSED = "http://127.0.0.1:9"
"""A local port nothing listens on: any request Codex tries beyond loopback fails here."""


@dataclass(frozen=True)
class CodexRun:
    returncode: int
    stdout: str
    stderr: str
    last_message: str
    seconds: float


@pytest.fixture(scope="session")
def codex() -> Path:
    return codex_executable()


def codex_home(root: Path, base_url: str, *flags: str) -> Path:
    """A fresh CODEX_HOME holding only what `mlxcel codex-config --write` wrote."""
    home = root / "codex-home"
    mlxcel = Path(sys.executable).with_name("mlxcel")
    env = {**os.environ, "CODEX_HOME": str(home)}
    command = [str(mlxcel), "codex-config", "--write", "--base-url", base_url, *flags]
    subprocess.run(command, env=env, check=True, capture_output=True, timeout=120)
    assert [p.name for p in home.iterdir()] == ["config.toml"]
    return home


def loopback_only(home: Path) -> dict[str, str]:
    node = shutil.which("node")
    assert node is not None
    proxies = {
        name: CLOSED
        for name in ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "http_proxy", "https_proxy")
    }
    return {
        "HOME": str(home.parent),
        "CODEX_HOME": str(home),
        "PATH": f"{Path(node).parent}:/usr/bin:/bin",
        "NO_PROXY": "127.0.0.1,localhost",
        "no_proxy": "127.0.0.1,localhost",
        **proxies,
    }


async def run_codex(
    codex: Path, home: Path, prompt: str, *options: str, timeout: float = 120
) -> CodexRun:
    """`codex exec` in an empty working directory, its last message written to a file."""
    work = home.parent / "work"
    work.mkdir(exist_ok=True)
    last = home.parent / "last-message.txt"
    command = [str(codex), "exec", "--skip-git-repo-check", "--color", "never"]
    command += ["--output-last-message", str(last), *options, prompt]
    started = time.monotonic()
    with trio.fail_after(timeout):
        done = await trio.run_process(
            command,
            cwd=work,
            env=loopback_only(home),
            stdin=b"",
            capture_stdout=True,
            capture_stderr=True,
            check=False,
        )
    seconds = time.monotonic() - started
    message = last.read_text() if last.is_file() else ""
    out, err = done.stdout.decode(), done.stderr.decode()
    return CodexRun(done.returncode, out, err, message, seconds)


async def test_codex_completes_a_turn_through_progress_events(
    start_fake_server: StartServer, codex: Path, tmp_path: Path
) -> None:
    """Codex's whole first request (its instructions, tools and environment) is served,
    with `mlx.progress` events in the stream while the fake reads the prompt slowly."""
    engine = FakeEngine(step_delay=0.01, prefill_chunk=200)
    server = await start_fake_server(engine, context_length=65536, sse_keepalive_secs=0.05)
    home = codex_home(tmp_path, f"{server.url}/v1", "--alias", "fake-model")
    run = await run_codex(codex, home, "echo: hello from codex")
    assert run.returncode == 0, run.stderr
    assert run.last_message.strip() == "hello from codex"
    assert "hello from codex" in run.stdout


@pytest.fixture(scope="session")
def codex_real_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RealServer]:
    """The default model, keep-alives (progress events) every 10 s as by default."""
    log = tmp_path_factory.mktemp("server") / "codex.log"
    yield from start_server(log, "--parallel", "1")


async def test_codex_completes_a_turn_on_the_real_model(
    codex_real_server: RealServer, codex: Path, tmp_path: Path
) -> None:
    """Codex's first prompt is about 8,400 tokens: its prefill takes minutes on a small
    CPU, longer than Codex's default 300 s idle limit would allow without progress events."""
    home = codex_home(tmp_path, f"{codex_real_server.url}/v1")
    run = await run_codex(codex, home, "Reply with one word: pong", timeout=1800)
    print(f"codex turn on the real model: {run.seconds:.0f} s")
    assert run.returncode == 0, run.stderr
    assert run.last_message.strip()
