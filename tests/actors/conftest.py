"""Fixtures of the actor tests."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from unittest import mock

import pytest

from mlxcel.model.tool_parsers import PARSERS

from builder_stream import Script, ScriptedParser


@pytest.fixture
def script() -> Iterator[Script]:
    """The batches the `scripted` tool-call format's parser reports (fill it in)."""
    batches: Script = []
    with mock.patch.dict(PARSERS, {"scripted": lambda names, schemas: ScriptedParser(batches)}):
        yield batches


@pytest.fixture(params=["memory", "sqlite"])
def store_spec(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """The `--store` of a store test: each such test runs on both backends."""
    return "memory" if request.param == "memory" else f"sqlite:{tmp_path / 'store.sqlite3'}"
