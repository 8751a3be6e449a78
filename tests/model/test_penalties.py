"""Frequency and presence penalties and `logit_bias`, per row, in the MLX engine.

The expected tokens are worked out here from the model's own logits and OpenAI's
formula, `logit[t] + bias[t] - count[t] * frequency - (count[t] > 0) * presence`,
independently of the engine's code.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import numpy as np
import pytest

from mlxcel.generation import Sampling, SequenceSpec, TokenStep
from mlxcel.model.engine import LoadedModel
from mlxcel.model.native.blas import load_fast_blas

from tiny_model import ensure_tiny_model, load_tiny

pytestmark = pytest.mark.mlx


@pytest.fixture(scope="module")
def tiny_path() -> Path:
    load_fast_blas()
    return ensure_tiny_model()


def load(path: Path) -> LoadedModel:
    loaded: LoadedModel = load_tiny(path)
    return loaded


def prompt(loaded: LoadedModel, text: str) -> tuple[int, ...]:
    return tuple(loaded.codec.render([{"role": "user", "content": text}], None))


def run_to_end(loaded: LoadedModel) -> dict[int, list[TokenStep]]:
    out: dict[int, list[TokenStep]] = {}
    while loaded.engine.has_work():
        for step in loaded.engine.step():
            out.setdefault(step.seq_id, []).append(step)
    return out


def _greedy(loaded: LoadedModel, text: str, sampling: Sampling) -> list[int]:
    loaded.engine.insert(SequenceSpec(1, prompt(loaded, text), sampling))
    return [s.token for s in run_to_end(loaded)[1]]


def _last_logits(loaded: LoadedModel, tokens: list[int]) -> np.ndarray:
    """The model's logits after `tokens`, from one plain forward (no engine)."""
    import mlx.core as mx

    model = loaded.engine.model  # type: ignore[attr-defined]
    out = model(mx.array([tokens]))[0, -1].astype(mx.float32)
    return np.array(out)


def test_adjust_applies_the_formula_to_the_rows_that_ask_only() -> None:
    load_fast_blas()
    import mlx.core as mx

    from mlxcel.model.penalties import RowPenalties, adjust

    rng = np.random.default_rng(7)
    raw = rng.normal(size=(3, 50)).astype(np.float32)
    sampling = Sampling(frequency_penalty=0.7, presence_penalty=0.3, logit_bias=((4, 5.0), (9, -2)))
    row = RowPenalties(sampling)
    generated = [3, 3, 4, 17, 3]
    for token in generated:
        row.note(token)
    batch = mx.array(raw)
    out = np.array(adjust(batch, [None, row, None]))
    expected = raw.copy()
    for token, count in Counter(generated).items():
        expected[1, token] -= count * 0.7 + 0.3
    expected[1, 4] += 5.0
    expected[1, 9] -= 2.0
    np.testing.assert_allclose(out, expected, rtol=0, atol=1e-5)
    assert adjust(batch, [None, None, None]) is batch  # no row asks: the fast path
    assert RowPenalties.for_sampling(Sampling()) is None


def test_greedy_tokens_follow_the_penalised_logits(tiny_path: Path) -> None:
    loaded = load(tiny_path)
    text = "Repeat after me: the the the the"
    frequency, presence = 0.5, -2.0  # a random model seldom repeats: make it
    sampling = Sampling(
        temperature=0, max_tokens=12, frequency_penalty=frequency, presence_penalty=presence
    )
    plain = _greedy(loaded, text, Sampling(temperature=0, max_tokens=12))
    penalised = _greedy(loaded, text, sampling)
    assert penalised != plain  # the penalty changes this greedy output
    context = list(prompt(loaded, text))
    for k, token in enumerate(penalised):
        logits = _last_logits(loaded, context + penalised[:k])
        for seen, count in Counter(penalised[:k]).items():
            logits[seen] -= count * frequency + presence
        # The engine's batched forward rounds a little differently: the token it chose
        # is the argmax of the adjusted logits up to that rounding.
        assert logits[token] >= logits.max() - 1e-3, (k, token, int(logits.argmax()))
    loaded.engine.close()


def test_logit_bias_forces_and_bans_tokens(tiny_path: Path) -> None:
    loaded = load(tiny_path)
    text = "Say something"
    forced = loaded.codec.encode(" banana")[0]
    out = _greedy(
        loaded, text, Sampling(temperature=1.0, seed=3, max_tokens=6, logit_bias=((forced, 100),))
    )
    assert out == [forced] * 6
    plain = _greedy(loaded, text, Sampling(temperature=0, max_tokens=4))
    banned = _greedy(
        loaded, text, Sampling(temperature=0, max_tokens=4, logit_bias=((plain[0], -100),))
    )
    assert plain[0] not in banned
    loaded.engine.close()


def test_a_penalised_row_leaves_its_batch_neighbours_alone(tiny_path: Path) -> None:
    loaded = load(tiny_path)
    text = "Count: one two three"
    alone = _greedy(loaded, text, Sampling(temperature=0, max_tokens=10))
    engine = loaded.engine
    engine.insert(SequenceSpec(1, prompt(loaded, text), Sampling(temperature=0, max_tokens=10)))
    engine.insert(
        SequenceSpec(
            2,
            prompt(loaded, text),
            Sampling(temperature=0, max_tokens=10, presence_penalty=-2.0),
        )
    )
    out = run_to_end(loaded)
    assert [s.token for s in out[1]] == alone
    assert [s.token for s in out[2]] != alone
    engine.close()
