"""The prefix cache with its disk tier, on the tiny random-weight model: what memory
evicts and what a closing engine holds is read back by the next engine, and generates
exactly what a cold read does."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from mlxcel.generation import Sampling, SequenceSpec
from mlxcel.model.engine import LoadedModel
from mlxcel.model.native.blas import load_fast_blas

from tiny_model import ensure_tiny_model

pytestmark = pytest.mark.mlx


def load(cache_bytes: int, folder: Path | None) -> LoadedModel:
    load_fast_blas()
    from mlxcel.model.mlx_load import load_mlx_model

    return load_mlx_model(
        ensure_tiny_model(),
        name="tiny",
        max_batch=2,
        prefill_step_size=64,
        blas=load_fast_blas(),
        prompt_cache_bytes=cache_bytes,
        prompt_cache_dir=folder,
        prompt_cache_disk_bytes=1 << 30,
    )


def prompt(loaded: LoadedModel, text: str) -> list[int]:
    return loaded.codec.render([{"role": "user", "content": text}], None)


def answer(loaded: LoadedModel, seq_id: int, tokens: list[int], tenant: str = "") -> Any:
    """The greedy tokens and the first step's cached tokens."""
    engine = loaded.engine
    engine.insert(SequenceSpec(seq_id, tuple(tokens), Sampling(0.0, max_tokens=8), tenant))
    steps = []
    while engine.has_work():
        steps += [s for s in engine.step() if s.seq_id == seq_id]
    return [s.token for s in steps], steps[0].cached_tokens


def test_a_closed_engines_cache_serves_the_next_engine(tmp_path: Path) -> None:
    folder = tmp_path / "cache"
    cold = load(0, None)
    first = load(1 << 26, folder)
    text = prompt(first, "Describe the harbour at dawn, every boat in turn. " * 12)
    want, _ = answer(cold, 1, text)
    got, cached = answer(first, 1, text, tenant="t")
    assert (got, cached) == (want, 0)
    first.engine.close()  # writes every entry
    second = load(1 << 26, folder)
    got, cached = answer(second, 1, text, tenant="t")
    assert got == want
    assert cached == len(text) - 1
    stats = second.prompt_disk() if second.prompt_disk else None
    assert stats is not None
    assert stats.hits == 1
    other, cached = answer(second, 2, text, tenant="u")  # another tenant: read cold
    assert (other, cached) == (want, 0)
    second.engine.close()
    cold.engine.close()


def test_what_memory_evicts_is_spilled_and_read_back(tmp_path: Path) -> None:
    folder = tmp_path / "cache"
    loaded = load(1 << 26, folder)
    engine: Any = loaded.engine
    texts = [prompt(loaded, f"Topic {n}: " + "tell me about the weather. " * 15) for n in range(2)]
    want, _ = answer(loaded, 1, texts[0])
    entry_bytes = engine.prefix_cache.nbytes
    engine.prefix_cache.max_bytes = entry_bytes + entry_bytes // 2  # room for one entry
    answer(loaded, 2, texts[1])  # evicts the first entry: it goes to disk
    engine.prefix_cache.disk.flush()
    assert list(folder.rglob("*.safetensors"))
    got, cached = answer(loaded, 3, texts[0])
    assert got == want
    assert cached == len(texts[0]) - 1
    engine.prefix_cache.max_bytes = 1 << 26
    answer(loaded, 4, prompt(loaded, "Something else entirely, at length. " * 12))
    files = set(folder.rglob("*.safetensors"))
    queued = engine.spill_prompt_cache()  # what is not on disk yet: at least the last one
    engine.prefix_cache.disk.flush()
    assert queued >= 1
    assert len(set(folder.rglob("*.safetensors")) - files) == queued
    engine.close()
    assert engine.prefix_cache is None


def test_a_folder_that_cannot_be_written_leaves_the_cache_in_memory(tmp_path: Path) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    loaded = load(1 << 26, blocker / "cache")  # became unwritable after the start's check
    assert loaded.prompt_disk is None
    text = prompt(loaded, "Name three rivers, and say where each one meets the sea. " * 6)
    first, _ = answer(loaded, 1, text)
    again, cached = answer(loaded, 2, text)
    assert again == first
    assert cached == len(text) - 1
    loaded.engine.close()
