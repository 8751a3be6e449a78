"""Codex with its web search on (it sends the hosted `web_search` tool) against a server
that ignores hosted tools, and one that rejects them (the default): the rejection Codex
prints names the flag that would let it through. Needs the `--hosted-tools` flag."""

from __future__ import annotations

from pathlib import Path

import pytest
import trio

from mlxcel.model.fake import FakeEngine

from codex_cli import codex_home, run_codex
from support import StartServer

pytestmark = pytest.mark.e2e

WEB_SEARCH_ON = ("-c", 'web_search="live"')


async def test_codex_with_web_search_against_hosted_tools_ignore(
    start_fake_server: StartServer, codex: Path, tmp_path: Path
) -> None:
    server = await start_fake_server(
        FakeEngine(step_delay=0.002), context_length=65536, hosted_tools="ignore"
    )
    home = codex_home(tmp_path, f"{server.url}/v1", "--alias", "fake-model")
    with trio.fail_after(120):
        run = await run_codex(codex, home, "echo: searched nothing", *WEB_SEARCH_ON)
    assert run.returncode == 0, run.stderr
    assert run.last_message.strip() == "searched nothing"


async def test_codex_with_web_search_against_hosted_tools_reject(
    start_fake_server: StartServer, codex: Path, tmp_path: Path
) -> None:
    server = await start_fake_server(
        FakeEngine(step_delay=0.002), context_length=65536, hosted_tools="reject"
    )
    home = codex_home(tmp_path, f"{server.url}/v1", "--alias", "fake-model")
    with trio.fail_after(120):
        run = await run_codex(codex, home, "echo: never answered", *WEB_SEARCH_ON)
    assert run.returncode != 0
    assert "--hosted-tools" in run.stderr
    assert "web_search" in run.stderr
    assert not run.last_message.strip()
