"""The real Codex CLI, pinned, installed from the npm registry into `<repo>/.codex-cli`
the first time a test needs it (skipped when that exact version is already there), and
run as a user would: `codex exec` with a fresh `CODEX_HOME` holding only what
`mlxcel codex-config --write` produced, in an environment where only 127.0.0.1 is
reachable (every proxy variable points at a closed local port, loopback excepted)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import trio
from npm_package import NpmPackage

CODEX = NpmPackage("@openai/codex", "0.171.0", ".codex-cli")


def codex_executable() -> Path:
    """The pinned Codex CLI's launcher."""
    return CODEX.executable("codex")


CLOSED = "http://127.0.0.1:9"
"""A local port nothing listens on: any request Codex tries beyond loopback fails here."""


@dataclass(frozen=True)
class CodexRun:
    returncode: int
    stdout: str
    stderr: str
    last_message: str
    seconds: float


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


async def run_codex(codex: Path, home: Path, prompt: str, *options: str) -> CodexRun:
    """`codex exec` in an empty working directory, its last message written to a file
    (callers bound it with `trio.fail_after`)."""
    work = home.parent / "work"
    work.mkdir(exist_ok=True)
    last = home.parent / "last-message.txt"
    command = [str(codex), "exec", "--skip-git-repo-check", "--color", "never"]
    command += ["--output-last-message", str(last), *options, prompt]
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
    message = last.read_text() if last.is_file() else ""
    out, err = done.stdout.decode(), done.stderr.decode()
    return CodexRun(done.returncode, out, err, message, seconds)
