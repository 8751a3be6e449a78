"""The package type-checks under mypy --strict and lints clean under ruff."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_mypy_strict(tmp_path: Path) -> None:
    # mypy names modules after folders; the repository root is the `mlxcel` package,
    # so check it through a link of that name.
    (tmp_path / "mlxcel").symlink_to(ROOT, target_is_directory=True)
    env = {**os.environ, "MYPYPATH": str(tmp_path)}
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "mypy",
            "--config-file",
            str(ROOT / "pyproject.toml"),
            "--cache-dir",
            str(ROOT / ".mypy_cache"),
            "-p",
            "mlxcel",
        ],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_ruff_lint_and_format() -> None:
    for command in (["check"], ["format", "--check"]):
        result = subprocess.run(
            [sys.executable, "-m", "ruff", *command, str(ROOT)],
            cwd=ROOT,
            capture_output=True,
            text=True,
        )
        assert result.returncode == 0, result.stdout + result.stderr
