"""The runnable examples in docs/ run cleanly against a server (fake engine)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
import trio

from support import FakeServer

EXAMPLES = sorted((Path(__file__).resolve().parents[1] / "docs" / "examples").glob("*.py"))


@pytest.mark.parametrize("example", EXAMPLES, ids=lambda p: p.name)
async def test_example_runs(fake_server: FakeServer, example: Path) -> None:
    env = {**os.environ, "MLXCEL_BASE_URL": f"{fake_server.url}/v1", "MLXCEL_MODEL": "fake-model"}
    result = await trio.run_process(
        [sys.executable, str(example)],
        env=env,
        capture_stdout=True,
        capture_stderr=True,
        check=False,
    )
    assert result.returncode == 0, result.stderr.decode()
    assert result.stdout.strip()
