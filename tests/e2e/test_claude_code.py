"""End to end with the real Claude Code CLI (pinned; installed on first use), configured
only by `mlxcel claude-config --write` (see `claude_code_cli.py`): a turn on the fake
engine with Claude Code's whole first request, a Bash tool round trip, and a turn on
the real model with a short system prompt and one tool. Every request it makes is
`POST /v1/messages?beta=true`, and none is refused."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from unittest import mock

import pytest
import trio

from mlxcel.generation import SequenceSpec
from mlxcel.http import exchange
from mlxcel.model.fake import DEFAULT_REPLY, FakeEngine

from claude_code_cli import claude_home, run_claude
from server_process import RealServer
from support import StartServer

pytestmark = pytest.mark.e2e

SHORT_SYSTEM = "You are a terse assistant. Answer in as few words as you can."
"""Claude Code's own system prompt and tools are about 12,000 tokens: on the real model
the test swaps them for this and the Bash tool alone (`--system-prompt`, `--tools`)."""
PROOF = "round trip"
BASH_CALL = (
    '<tool_call>{"name": "Bash", "arguments": {"command": "echo round trip > proof.txt '
    '&& cat proof.txt", "description": "Write the proof file"}}</tool_call>'
)


def claude_reply(prompt: str) -> str:
    """What the fake model answers Claude Code: after a tool's output, `tool said: OUTPUT`;
    else the text after the last `echo:` of the last user message that has one (Claude
    Code puts its own reminders in the same message, before the user's text)."""
    for segment in reversed(prompt.split("\x01")):
        role, _, content = segment.partition("\x02")
        content = content.split("\x00", 1)[0]  # the engine's end-of-prompt mark
        if role == "tool":
            return f"tool said: {content.strip()}"
        if role == "user" and "echo:" in content:
            return content.rsplit("echo:", 1)[1].strip()
    return DEFAULT_REPLY


class ClaudeScriptEngine(FakeEngine):
    """The fake engine, its replies scripted by `claude_reply`."""

    def insert(self, spec: SequenceSpec) -> None:
        super().insert(spec)
        words = claude_reply(self.last_prompt).split(" ")
        self._seqs[spec.seq_id].words = [w if i == 0 else f" {w}" for i, w in enumerate(words)]


@pytest.fixture
def exchanges() -> Iterator[list[tuple[str, str, int | None]]]:
    """Every exchange the in-process server logs: (path, query string, status), as the
    server saw them."""
    seen: list[tuple[str, str, int | None]] = []
    real = exchange.log_exchange

    def record(scope: Any, status: int | None, seconds: float) -> None:
        seen.append((scope["path"], scope["query_string"].decode(), status))
        real(scope, status, seconds)

    with mock.patch.object(exchange, "log_exchange", record):
        yield seen


def messages_only(seen: list[tuple[str, str, int | None]]) -> list[tuple[str, str, int | None]]:
    return [e for e in seen if e[0] != "/health"]  # the fixture's own readiness polls


async def test_claude_code_completes_a_turn_on_the_fake_engine(
    start_fake_server: StartServer,
    claude: Path,
    tmp_path: Path,
    exchanges: list[tuple[str, str, int | None]],
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Claude Code's whole first request (its system prompt, reminders and tools)."""
    caplog.set_level(logging.INFO, "mlxcel.access")
    engine = ClaudeScriptEngine(step_delay=0.002)
    server = await start_fake_server(engine, context_length=262144, sse_keepalive_secs=0.05)
    home = claude_home(tmp_path, server.url, "--alias", "fake-model")
    with trio.fail_after(120):
        run = await run_claude(claude, home, "echo: hello from claude code")
    assert run.returncode == 0, run.stderr
    assert run.result["result"] == "hello from claude code"
    assert not run.result["is_error"]
    assert messages_only(exchanges) == [("/v1/messages", "beta=true", 200)]
    logged = [r.getMessage() for r in caplog.records if r.name == "mlxcel.access"]
    assert [line for line in logged if "path=/v1/messages?beta=true " in line]
    assert not [line for line in logged if " status=4" in line]
    assert "x-anthropic-billing-header" not in engine.last_prompt  # no nonce to strip
    assert "Bash" in engine.last_prompt  # its full tool set was read


async def test_claude_code_runs_a_bash_tool_round_trip_on_the_fake_engine(
    start_fake_server: StartServer,
    claude: Path,
    tmp_path: Path,
    exchanges: list[tuple[str, str, int | None]],
) -> None:
    """The model calls Bash; Claude Code runs it and sends its output back; the model's
    answer quotes it. The server requires a key, which the config carries."""
    engine = ClaudeScriptEngine(step_delay=0.002)
    server = await start_fake_server(engine, context_length=262144, api_keys=("sk-claude",))
    home = claude_home(tmp_path, server.url, "--alias", "fake-model", "--api-key", "sk-claude")
    with trio.fail_after(120):
        run = await run_claude(claude, home, f"echo: {BASH_CALL}", "--allowedTools", "Bash")
    assert run.returncode == 0, run.stderr
    assert run.result["result"] == f"tool said: {PROOF}"
    assert run.result["num_turns"] == 2
    assert (tmp_path / "work" / "proof.txt").read_text() == f"{PROOF}\n"
    assert messages_only(exchanges) == [("/v1/messages", "beta=true", 200)] * 2


async def test_claude_code_completes_a_turn_on_the_real_model(
    progress_server: RealServer, claude: Path, tmp_path: Path
) -> None:
    """A short system prompt and one tool, as the README says: a turn of Claude Code's
    own would take minutes to read on a small CPU."""
    home = claude_home(tmp_path, progress_server.url)
    before = len(progress_server.log.read_text().splitlines())
    options = ("--system-prompt", SHORT_SYSTEM, "--tools", "Bash")
    with trio.fail_after(1800):
        run = await run_claude(claude, home, "Reply with one word: pong", *options)
    print(f"claude code turn on the real model: {run.seconds:.0f} s")
    assert run.returncode == 0, run.stderr
    assert not run.result["is_error"]
    assert run.result["result"].strip()
    lines = progress_server.log.read_text().splitlines()[before:]
    access = [line for line in lines if "mlxcel.access" in line and "path=/health" not in line]
    assert access, lines
    assert all("method=POST path=/v1/messages?beta=true status=200" in line for line in access), (
        access
    )
