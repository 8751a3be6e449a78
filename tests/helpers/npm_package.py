"""A client from the npm registry, pinned, installed into a folder of the repository
the first time a test needs it (skipped when that exact version is already there)."""

from __future__ import annotations

import fcntl
import json
import subprocess
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


@dataclass(frozen=True)
class NpmPackage:
    name: str
    """The package's npm name, scope included."""
    version: str
    folder: str
    """Its install prefix, a folder at the repository's root."""

    @property
    def prefix(self) -> Path:
        return REPO / self.folder

    def installed_version(self) -> str | None:
        manifest = self.prefix / "node_modules" / self.name / "package.json"
        if not manifest.is_file():
            return None
        return str(json.loads(manifest.read_text())["version"])

    def executable(self, command: str) -> Path:
        """The launcher `command` of the pinned version, installed first if it is
        missing or another version."""
        self.prefix.mkdir(exist_ok=True)
        # Test processes running side by side install one at a time; the second finds
        # the version the first installed.
        with (self.prefix / ".install.lock").open("a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            if self.installed_version() != self.version:
                npm = ["npm", "install", "--no-audit", "--no-fund", "--prefix", str(self.prefix)]
                subprocess.run(
                    [*npm, f"{self.name}@{self.version}"],
                    check=True,
                    capture_output=True,
                    timeout=900,
                )
        assert self.installed_version() == self.version
        return self.prefix / "node_modules" / ".bin" / command
