"""Greedy tokens of the real default model: the fused layers write what the composed ones do.

The engine loads the model twice, once with the fused layers (``MLXCEL_FUSED_LAYER=1``)
and once with ``MLXCEL_FUSED_LAYER=0``, and writes greedy tokens for the parity prompts: all
four in one batch (a decode batch of four rows beside prompt chunks), and the shortest
alone (one row: the engine's decode-alone path). Every token must agree; the agreement
rate is printed either way, for the benchmark notes.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from mlxcel.generation import Sampling, SequenceSpec
from mlxcel.model.engine import LoadedModel
from mlxcel.model.native.blas import load_fast_blas
from mlxcel.model.provision.fetch import default_model_dir, is_ready

from parity_prompts import SYSTEM, TEXTS

pytestmark = pytest.mark.mlx

TOKENS = 32


def load(path: Path) -> LoadedModel:
    from mlxcel.model.mlx_load import load_mlx_model

    return load_mlx_model(
        path,
        name=path.name,
        max_batch=len(TEXTS),
        prefill_step_size=40,
        blas=load_fast_blas(),
        prompt_cache_bytes=0,
    )


def greedy(loaded: LoadedModel, texts: tuple[str, ...]) -> list[list[int]]:
    engine = loaded.engine
    for i, text in enumerate(texts):
        messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": text}]
        prompt = loaded.codec.render(messages, None)
        engine.insert(SequenceSpec(i, tuple(prompt), Sampling(temperature=0.0, max_tokens=TOKENS)))
    out: list[list[int]] = [[] for _ in texts]
    while engine.has_work():
        for step in [*engine.decode(), *engine.prefill()]:
            out[step.seq_id].append(step.token)
    return out


def test_fused_and_composed_layers_write_the_same_greedy_tokens(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    path = default_model_dir()
    assert is_ready(path), "the default model is missing: run `mlxcel fetch-model` first"
    runs: dict[str, list[list[int]]] = {}
    for switch in ("1", "0"):
        monkeypatch.setenv("MLXCEL_FUSED_LAYER", switch)
        loaded = load(path)
        assert (loaded.engine.fused is not None) == (switch == "1")  # type: ignore[attr-defined]
        runs[switch] = greedy(loaded, TEXTS) + greedy(loaded, TEXTS[:1])
        loaded.engine.close()
    pairs = [
        (a, b) for x, y in zip(runs["1"], runs["0"], strict=True) for a, b in zip(x, y, strict=True)
    ]
    agree = sum(a == b for a, b in pairs)
    print(f"fused/composed greedy agreement: {agree}/{len(pairs)} tokens")
    assert all(len(r) > 0 for r in runs["1"])
    assert runs["1"] == runs["0"]
