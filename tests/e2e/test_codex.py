"""End to end with the real Codex CLI (pinned; installed on first use), configured only by
`mlxcel codex-config --write` (see `codex_cli.py`)."""

from __future__ import annotations

from pathlib import Path

import pytest
import trio

from mlxcel.model.fake import FakeEngine

from codex_cli import codex_home, run_codex
from server_process import RealServer
from support import StartServer

pytestmark = pytest.mark.e2e


async def test_codex_completes_a_turn_through_progress_events(
    start_fake_server: StartServer, codex: Path, tmp_path: Path
) -> None:
    """Codex's whole first request (its instructions, tools and environment) is served,
    with `mlx.progress` events in the stream while the fake reads the prompt slowly."""
    engine = FakeEngine(step_delay=0.01, prefill_chunk=200)
    server = await start_fake_server(engine, context_length=65536, sse_keepalive_secs=0.05)
    home = codex_home(tmp_path, f"{server.url}/v1", "--alias", "fake-model")
    with trio.fail_after(120):
        run = await run_codex(codex, home, "echo: hello from codex")
    assert run.returncode == 0, run.stderr
    assert run.last_message.strip() == "hello from codex"
    assert "hello from codex" in run.stdout


async def test_codex_completes_a_turn_on_the_real_model(
    progress_server: RealServer, codex: Path, tmp_path: Path
) -> None:
    """Codex's first prompt is about 8,400 tokens: its prefill takes minutes on a small
    CPU, longer than Codex's default 300 s idle limit would allow without progress events."""
    home = codex_home(tmp_path, f"{progress_server.url}/v1")
    with trio.fail_after(1800):
        run = await run_codex(codex, home, "Reply with one word: pong")
    print(f"codex turn on the real model: {run.seconds:.0f} s")
    assert run.returncode == 0, run.stderr
    assert run.last_message.strip()
