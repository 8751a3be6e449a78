"""The real Claude Code CLI, pinned, installed from the npm registry into
`<repo>/.claude-code-cli` the first time a test needs it (skipped when that exact version
is already there), and run as a user would: `claude -p` with a fresh config folder
holding only what `mlxcel claude-config --write` produced, and no other variable telling
it anything, in an environment where only 127.0.0.1 is reachable (every proxy variable
points at a closed local port, loopback excepted)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import trio
from npm_package import NpmPackage

from codex_cli import CLOSED

CLAUDE_CODE = NpmPackage("@anthropic-ai/claude-code", "2.1.332", ".claude-code-cli")


def claude_executable() -> Path:
    """The pinned Claude Code's launcher (a native binary the package ships)."""
    claude = CLAUDE_CODE.executable("claude")
    shown = subprocess.run([str(claude), "--version"], capture_output=True, text=True, timeout=60)
    assert shown.stdout.startswith(CLAUDE_CODE.version), shown.stdout + shown.stderr
    return claude


@dataclass(frozen=True)
class ClaudeRun:
    returncode: int
    stdout: str
    stderr: str
    seconds: float

    @property
    def result(self) -> dict[str, Any]:
        """The `--output-format json` record of the run (its last line)."""
        lines = self.stdout.strip().splitlines()
        assert lines, self.stderr
        record: dict[str, Any] = json.loads(lines[-1])
        return record


def claude_home(root: Path, base_url: str, *flags: str) -> Path:
    """A fresh home whose Claude Code config folder holds only what
    `mlxcel claude-config --write` wrote."""
    home = root / "claude-home"
    config = home / ".claude"
    mlxcel = Path(sys.executable).with_name("mlxcel")
    ours = ("MLXCEL_", "LLAMA_ARG_", "LLAMA_API_KEY")  # only `flags` speak for the server
    env = {k: v for k, v in os.environ.items() if not k.startswith(ours)}
    env["CLAUDE_CONFIG_DIR"] = str(config)
    command = [str(mlxcel), "claude-config", "--write", "--base-url", base_url, *flags]
    subprocess.run(command, env=env, check=True, capture_output=True, timeout=120)
    assert [p.name for p in config.iterdir()] == ["settings.json"]
    return home


def loopback_only(home: Path) -> dict[str, str]:
    """Nothing but a home, a PATH for its Bash tool, and proxies that go nowhere: the
    server's address, key and model come from the settings file alone."""
    proxies = {
        name: CLOSED
        for name in ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "http_proxy", "https_proxy")
    }
    return {
        "HOME": str(home),
        "CLAUDE_CONFIG_DIR": str(home / ".claude"),
        "PATH": "/usr/bin:/bin",
        "NO_PROXY": "127.0.0.1,localhost",
        "no_proxy": "127.0.0.1,localhost",
        **proxies,
    }


async def run_claude(claude: Path, home: Path, prompt: str, *options: str) -> ClaudeRun:
    """`claude -p PROMPT --output-format json` in an empty working folder (callers bound
    it with `trio.fail_after`)."""
    work = home.parent / "work"
    work.mkdir(exist_ok=True)
    command = [str(claude), "-p", prompt, "--output-format", "json", *options]
    started = time.monotonic()
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
    return ClaudeRun(done.returncode, done.stdout.decode(), done.stderr.decode(), seconds)
