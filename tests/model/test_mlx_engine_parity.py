"""Greedy parity: the MLX engine writes exactly what mlx-lm's own batching writes.

The engine has its own step policy, forwards and sampling; mlx-lm's `BatchGenerator`
(the path the engine replaced) is the reference. Four prompts of different lengths go
in together, one longer than the prefill cap so both read it in chunks, and every
sequence's greedy tokens must match the reference's token for token, on the tiny
random model and on the real default model.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from mlxcel.generation import Sampling, SequenceSpec
from mlxcel.model.engine import LoadedModel
from mlxcel.model.native.blas import load_fast_blas
from mlxcel.model.provision.fetch import default_model_dir, is_ready

from parity_prompts import SYSTEM, TEXTS
from tiny_model import ensure_tiny_model

pytestmark = pytest.mark.mlx

CAP = 40
"""Prefill step of both paths; the last prompt is longer, so it is read in chunks."""


def load(path: Path) -> LoadedModel:
    from mlxcel.model.mlx_load import load_mlx_model

    return load_mlx_model(
        path,
        name=path.name,
        max_batch=len(TEXTS),
        prefill_step_size=CAP,
        blas=load_fast_blas(),
        prompt_cache_bytes=0,
    )


def prompts(loaded: LoadedModel) -> list[list[int]]:
    return [
        loaded.codec.render(
            [{"role": "system", "content": SYSTEM}, {"role": "user", "content": t}], None
        )
        for t in TEXTS
    ]


def engine_tokens(loaded: LoadedModel, rows: list[list[int]], max_tokens: int) -> list[list[int]]:
    engine = loaded.engine
    for i, row in enumerate(rows):
        engine.insert(SequenceSpec(i, tuple(row), Sampling(temperature=0.0, max_tokens=max_tokens)))
    out: list[list[int]] = [[] for _ in rows]
    while engine.has_work():
        for step in [*engine.decode(), *engine.prefill()]:
            out[step.seq_id].append(step.token)
    return out


def reference_tokens(
    model: Any, tokenizer: Any, rows: list[list[int]], max_tokens: int
) -> list[list[int]]:
    """mlx-lm's continuous batching, greedy, configured as `--parallel 4` once was."""
    from mlx_lm.generate import BatchGenerator

    gen: Any = BatchGenerator(
        model,
        stop_tokens=[[t] for t in tokenizer.eos_token_ids],
        completion_batch_size=len(rows),
        prefill_batch_size=min(len(rows), 8),
        prefill_step_size=CAP,
    )
    uids = gen.insert(rows, [max_tokens] * len(rows))
    out: dict[int, list[int]] = {uid: [] for uid in uids}
    while responses := gen.next_generated():
        for r in responses:
            out[r.uid].append(r.token)
    gen.close()
    return [out[uid] for uid in uids]


def assert_parity(path: Path, max_tokens: int) -> None:
    loaded = load(path)
    rows = prompts(loaded)
    lengths = sorted(len(r) for r in rows)
    assert len(set(lengths)) == len(rows)
    assert lengths[-1] > CAP >= lengths[-2]
    engine: Any = loaded.engine
    reference = reference_tokens(engine.model, engine.tokenizer, rows, max_tokens)
    ours = engine_tokens(loaded, rows, max_tokens)
    loaded.engine.close()
    assert all(len(r) == max_tokens or r[-1] in engine.tokenizer.eos_token_ids for r in reference)
    for i, (mine, theirs) in enumerate(zip(ours, reference, strict=True)):
        diverge = next(
            (k for k, (a, b) in enumerate(zip(mine, theirs, strict=False)) if a != b), None
        )
        assert mine == theirs, f"prompt {i} ({len(rows[i])} tokens) diverges at {diverge}"


def test_tiny_model_matches_mlx_lm_batching() -> None:
    load_fast_blas()
    assert_parity(ensure_tiny_model(), max_tokens=24)


def test_default_model_matches_mlx_lm_batching() -> None:
    load_fast_blas()
    path = default_model_dir()
    assert is_ready(path), "the default model is missing: run `mlxcel fetch-model` first"
    assert_parity(path, max_tokens=16)
