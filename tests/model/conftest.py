"""Fixtures of the model tests."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest


@pytest.fixture(scope="session")
def tokenizer() -> Any:
    """The default model's real tokenizer (the test command fetches the model first)."""
    from tokenizers import Tokenizer

    from mlxcel.model.provision.fetch import default_model_dir, is_ready

    path = default_model_dir()
    assert is_ready(path), "the default model is missing: run `mlxcel fetch-model` first"
    return Tokenizer.from_file(str(Path(path) / "tokenizer.json"))
