"""Control tokens are masked out of sampling in the MLX engine: a reply never holds one,
however a `logit_bias` pushes it, in a batch or under a grammar; the end token still ends
the turn. Runs the tiny model with the default model's real tokenizer."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from mlxcel.generation import Sampling, SequenceSpec, TokenStep
from mlxcel.model.engine import LoadedModel
from mlxcel.model.native.blas import load_fast_blas

from tiny_model import ensure_tiny_model, load_tiny

pytestmark = pytest.mark.mlx

IM_START = 151644
IM_END = 151645


@pytest.fixture(scope="module")
def tiny_path() -> Path:
    load_fast_blas()
    return ensure_tiny_model()


def prompt(loaded: LoadedModel, text: str) -> tuple[int, ...]:
    return tuple(loaded.codec.render([{"role": "user", "content": text}], None))


def run_to_end(loaded: LoadedModel) -> dict[int, list[TokenStep]]:
    out: dict[int, list[TokenStep]] = {}
    while loaded.engine.has_work():
        for step in loaded.engine.step():
            out.setdefault(step.seq_id, []).append(step)
    return out


def special_ids(loaded: LoadedModel) -> set[int]:
    tokenizer = loaded.engine.tokenizer._tokenizer  # type: ignore[attr-defined]
    return {i for i, t in tokenizer.added_tokens_decoder.items() if t.special}


def test_the_mask_sets_control_tokens_to_minus_infinity_in_every_row() -> None:
    load_fast_blas()
    import mlx.core as mx

    from mlxcel.model.control_tokens import ControlMask

    raw = np.random.default_rng(5).normal(size=(3, 20)).astype(np.float32)
    raw[2, 4] = -np.inf  # a grammar already forbade it
    out = np.array(ControlMask([4, 7, 99]).apply(mx.array(raw)))  # 99: past the width
    expected = raw.copy()
    expected[:, [4, 7]] = -np.inf
    np.testing.assert_array_equal(out, expected)
    batch = mx.array(raw)
    assert ControlMask([]).apply(batch) is batch


def test_the_control_set_is_the_special_tokens_less_the_end_and_the_markup(
    tiny_path: Path,
) -> None:
    loaded = load_tiny(tiny_path)
    masked = set(loaded.engine.control.token_ids)  # type: ignore[attr-defined]
    ends = set(loaded.engine._stop)  # type: ignore[attr-defined]
    assert IM_START in masked
    assert IM_END in ends  # the end tokens end the turn
    assert masked == special_ids(loaded) - ends
    tool_call = loaded.codec.encode("<tool_call>")
    assert len(tool_call) == 1
    assert tool_call[0] not in masked
    loaded.engine.close()


def test_a_biased_control_token_is_never_sampled_alone_or_batched(tiny_path: Path) -> None:
    loaded = load_tiny(tiny_path)
    forced = ((IM_START, 100.0), (IM_END, -100.0))
    samplings = [
        Sampling(temperature=0, max_tokens=6, logit_bias=forced),
        Sampling(temperature=1.0, seed=4, max_tokens=6, logit_bias=forced),
        Sampling(temperature=0, max_tokens=6),
    ]
    for n, sampling in enumerate(samplings):
        loaded.engine.insert(SequenceSpec(n, prompt(loaded, f"Say something {n}"), sampling))
    out = run_to_end(loaded)
    controls = special_ids(loaded)
    for n in range(len(samplings)):
        tokens = [s.token for s in out[n]]
        assert len(tokens) == 6
        assert not controls & set(tokens), (n, tokens)
        assert "<|" not in "".join(s.text for s in out[n])
    loaded.engine.close()


def test_a_grammar_row_never_samples_a_control_token(tiny_path: Path) -> None:
    loaded = load_tiny(tiny_path)
    grammar = loaded.codec.compile_schema(
        {"type": "object", "properties": {"a": {"type": "string"}}, "required": ["a"]}
    )
    sampling = Sampling(
        temperature=0, max_tokens=12, grammar=grammar, logit_bias=((IM_START, 100.0),)
    )
    loaded.engine.insert(SequenceSpec(1, prompt(loaded, "JSON please"), sampling))
    tokens = [s.token for s in run_to_end(loaded)[1]]
    assert IM_START not in tokens
    assert not set(loaded.engine.control.token_ids) & set(tokens)  # type: ignore[attr-defined]
    loaded.engine.close()
