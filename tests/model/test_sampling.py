"""The sampler on MLX logits: numpy draws on a zero-copy view, MLX log-probabilities,
mlx-lm's top-p/top-k reading kept, and seeds that hold in the engine's batches.

The distributions themselves are tested in `test_draw.py`.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from mlxcel.generation import Sampling, SequenceSpec
from mlxcel.model.engine import LoadedModel
from mlxcel.model.native.blas import load_fast_blas

from tiny_model import ensure_tiny_model

pytestmark = pytest.mark.mlx

load_fast_blas()  # before mlx.core is imported below

import mlx.core as mx  # noqa: E402
from mlx_lm.sample_utils import apply_top_k, apply_top_p  # noqa: E402

from mlxcel.model.draw import draw, keep, row_generator  # noqa: E402
from mlxcel.model.sampling import Sampler, reference_log_softmax  # noqa: E402


def test_greedy_rows_equal_mlx_argmax_with_ties() -> None:
    logits = mx.round(mx.random.normal((16, 3_000), key=mx.random.key(1)) * 2)
    gens = [row_generator() for _ in range(16)]
    tokens, logprobs = Sampler().sample(logits, [Sampling(temperature=0.0)] * 16, gens)
    assert tokens == mx.argmax(logits, axis=-1).tolist()
    assert logprobs == {}


def test_tokens_are_numpys_draws_and_logprobs_come_for_the_rows_that_asked() -> None:
    logits = mx.random.normal((4, 500), key=mx.random.key(2)) * 3
    rows = [
        Sampling(temperature=1.0, logprobs=True),
        Sampling(temperature=0.0),
        Sampling(temperature=0.8, top_p=0.9, top_k=20, logprobs=True),
        Sampling(temperature=1.2),
    ]
    tokens, logprobs = Sampler().sample(logits, rows, [row_generator(i) for i in range(4)])
    assert tokens == draw(np.array(logits), rows, [row_generator(i) for i in range(4)])
    assert sorted(logprobs) == [0, 2]
    want = reference_log_softmax(logits)
    for i, vector in logprobs.items():
        assert mx.allclose(vector, want[i], atol=1e-5).item()


def test_half_precision_logits_are_read_as_float32() -> None:
    logits = (mx.random.normal((3, 200), key=mx.random.key(3)) * 2).astype(mx.float16)
    rows = [Sampling(temperature=0.7)] * 3
    tokens, _ = Sampler().sample(logits, rows, [row_generator(5)] * 3)
    as_float32 = np.array(logits.astype(mx.float32))
    assert tokens == draw(as_float32, rows, [row_generator(5)] * 3)


def test_masked_tokens_are_never_drawn() -> None:
    allowed = mx.arange(1_000) % 7 == 3
    logits = mx.where(allowed, mx.random.normal((8, 1_000), key=mx.random.key(4)), -mx.inf)
    rows = [Sampling(temperature=2.0), Sampling(temperature=1.0, top_p=0.99, top_k=500)] * 4
    gen = row_generator(8)
    for _ in range(50):
        tokens, _ = Sampler().sample(logits, rows, [gen] * 8)
        assert all(t % 7 == 3 for t in tokens)


@pytest.mark.parametrize(("top_p", "top_k"), [(0.9, 0), (0.5, 0), (1.0, 40), (0.95, 10)])
def test_kept_sets_are_mlx_lms(top_p: float, top_k: int) -> None:
    """The set mlx-lm's `make_sampler` left (top_p on the log-probabilities, then top_k),
    on continuous logits (no ties, where mlx-lm's `argpartition` picks arbitrarily).
    mlx-lm sums the sorted masses in float32 over the whole vocabulary, so a token whose
    exact mass above it is within 1e-3 of top_p may fall either way; no other may."""
    for seed in range(30):
        logits = mx.random.normal((151_936,), key=mx.random.key(seed)) * (1 + seed % 4)
        survivors = reference_log_softmax(logits)
        if top_p < 1:
            survivors = apply_top_p(survivors[None], top_p)[0]
        if top_k:
            survivors = apply_top_k(survivors[None], top_k)[0]
        theirs = set(np.flatnonzero(np.array(survivors) > -np.inf).tolist())
        row = np.array(logits)
        ours = set(keep(row, top_p, top_k, np.empty(len(row), dtype=np.float32)).tolist())
        if top_p >= 1:  # top-k alone: no sum involved
            assert ours == theirs
            continue
        order = np.argsort(-row)
        mass = np.exp(row[order].astype(np.float64) - row.max())
        above = (np.cumsum(mass) - mass) / mass.sum()  # exact mass above each token
        where = np.empty(len(row), dtype=np.intp)
        where[order] = np.arange(len(row))
        assert all(abs(above[where[t]] - top_p) < 1e-3 for t in ours ^ theirs)


# --- the engine: a request's seed ----------------------------------------------------


@pytest.fixture(scope="module")
def tiny_path() -> Path:
    return ensure_tiny_model()


def load(path: Path) -> LoadedModel:
    from mlxcel.model.mlx_load import load_mlx_model

    return load_mlx_model(
        path,
        name="tiny",
        max_batch=4,
        prefill_step_size=16,
        blas=load_fast_blas(),
        prompt_cache_bytes=0,
    )


def tokens_of(path: Path, specs: list[SequenceSpec], seq_id: int) -> list[int]:
    """The tokens sequence `seq_id` gets when `specs` run together on a fresh engine."""
    loaded = load(path)
    engine = loaded.engine
    for spec in specs:
        engine.insert(spec)
    out: list[int] = []
    while engine.has_work():
        out += [s.token for s in engine.step() if s.seq_id == seq_id]
    engine.close()
    return out


def test_a_seeded_request_repeats_in_any_batch(tiny_path: Path) -> None:
    codec = load(tiny_path).codec

    def spec(seq_id: int, text: str, sampling: Sampling) -> SequenceSpec:
        return SequenceSpec(
            seq_id, tuple(codec.render([{"role": "user", "content": text}], None)), sampling
        )

    seeded = spec(1, "tell me something", Sampling(1.0, max_tokens=12, seed=77))
    alone = tokens_of(tiny_path, [seeded], 1)
    assert len(alone) == 12
    others = [
        spec(2, "hello", Sampling(0.9, max_tokens=12)),
        spec(3, "greedy", Sampling(0.0, max_tokens=12)),
    ]
    assert tokens_of(tiny_path, [*others, seeded], 1) == alone
    beside = [
        spec(4, "more", Sampling(1.0, top_p=0.9, max_tokens=12)),
        spec(5, "x", Sampling(1.0, max_tokens=12, seed=77)),
    ]
    assert tokens_of(tiny_path, [beside[0], seeded, beside[1]], 1) == alone
    reseeded = spec(1, "tell me something", Sampling(1.0, max_tokens=12, seed=78))
    assert tokens_of(tiny_path, [reseeded], 1) != alone
