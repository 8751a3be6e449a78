"""A model folder read without loading it: what its `config.json` says."""

from __future__ import annotations

import json
from pathlib import Path

DEFAULT_CONTEXT_LENGTH = 32768
"""For a config that names no maximum position (mlx-lm's own assumption)."""


def context_length(path: Path) -> int:
    """The model's context window in tokens, from its folder's `config.json`."""
    config = json.loads((path / "config.json").read_text())
    return int(config.get("max_position_embeddings") or DEFAULT_CONTEXT_LENGTH)
