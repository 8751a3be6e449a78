"""The real Codex CLI, pinned, installed from the npm registry into `<repo>/.codex-cli`
the first time a test needs it (skipped when that exact version is already there)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

CODEX_VERSION = "0.171.0"
PREFIX = Path(__file__).resolve().parent.parent / ".codex-cli"


def installed_version() -> str | None:
    manifest = PREFIX / "node_modules" / "@openai" / "codex" / "package.json"
    if not manifest.is_file():
        return None
    return str(json.loads(manifest.read_text())["version"])


def codex_executable() -> Path:
    """The pinned Codex CLI's launcher, installed first if it is missing or another version."""
    if installed_version() != CODEX_VERSION:
        subprocess.run(
            [
                "npm",
                "install",
                "--no-audit",
                "--no-fund",
                "--prefix",
                str(PREFIX),
                f"@openai/codex@{CODEX_VERSION}",
            ],
            check=True,
            capture_output=True,
            timeout=900,
        )
    assert installed_version() == CODEX_VERSION
    return PREFIX / "node_modules" / ".bin" / "codex"
