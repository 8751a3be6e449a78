"""One forward per step: the flattened forward equals the separate ones.

A step's decode rows and a prompt chunk (rows at their first, a middle and their last
chunk, right-padded) go through `flat_forward.step_logits` and, from identical KV
states, through the separate decode and chunk forwards. The logits must agree within
float32 rounding, and so must the KV states they leave: the next decode step from
each gives the same logits. On the tiny qwen2 model, random llama and qwen3 models,
and the real default model.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from mlxcel.model.native.blas import load_fast_blas
from mlxcel.model.provision.fetch import default_model_dir, is_ready

from tiny_model import ensure_tiny_model

pytestmark = pytest.mark.mlx

DECODE_PROMPTS = ([5, 9, 2, 7, 1], [3, 8], [4, 4, 6, 1, 2, 9, 7, 5, 3])
"""Prompts of the decode rows (left-padded in their batch)."""
CHUNK = (([11, 12, 13, 14, 15, 16], []), ([21, 22, 23], [1, 2, 3, 4]), ([31, 32, 33, 34], [7, 8]))
"""Chunk rows: (tokens read now, tokens read before): a first chunk, and two later ones."""
ENDING = (False, True, True)
"""Which chunk rows end their prompt there (want logits); the first reads on."""


@pytest.fixture(scope="module", autouse=True)
def fast_blas() -> None:
    load_fast_blas()


def build_states(model: Any) -> tuple[Any, list[Any]]:
    """The decode batch's KV state and each chunk row's, built the same way every call."""
    import mlx.core as mx
    from mlx_lm.models.cache import make_prompt_cache

    from mlxcel.model import forward

    singles = []
    for tokens in DECODE_PROMPTS:
        cache = make_prompt_cache(model)
        forward.read_chunk(model, [tokens], [cache], [False])
        singles.append(cache)
    batch = forward.merge(singles)
    rows = []
    for _, before in CHUNK:
        cache = make_prompt_cache(model)
        if before:
            forward.read_chunk(model, [before], [cache], [False])
        rows.append(cache)
    mx.eval([layer.state for layer in batch])
    return batch, rows


def separate(model: Any) -> tuple[Any, Any, Any, list[Any]]:
    from mlxcel.model import forward

    batch, rows = build_states(model)
    decode = forward.decode_logits(model, [d[-1] for d in DECODE_PROMPTS], batch)
    caches, logits = forward.read_chunk(model, [c for c, _ in CHUNK], rows, ENDING)
    return decode, [logits[i] for i, e in enumerate(ENDING) if e], batch, caches


def flattened(model: Any, fused: Any = None) -> tuple[Any, Any, Any, list[Any]]:
    import mlx.core as mx

    from mlxcel.model import flat_forward, forward

    batch, rows = build_states(model)
    opened = forward.open_chunk([c for c, _ in CHUNK], rows)
    lasts = [[d[-1]] for d in DECODE_PROMPTS]
    groups = [
        flat_forward.Group(lasts, batch, [(i, 0) for i in range(len(lasts))]),
        flat_forward.Group(opened.tokens, opened.cache, opened.want(ENDING)),
    ]
    decode, firsts = flat_forward.step_logits(model, groups, fused)
    caches = forward.close_chunk(opened)
    mx.eval(decode, firsts, [layer.state for kv in caches for layer in kv])
    return decode, [firsts[n] for n in range(firsts.shape[0])], batch, caches


def next_logits(model: Any, batch: Any, caches: list[Any]) -> list[Any]:
    """One more decode step from each resulting state: the batch, and the chunk rows."""
    from mlxcel.model import forward

    out = [forward.decode_logits(model, [1] * len(DECODE_PROMPTS), batch)]
    out += [forward.decode_logits(model, [2], cache) for cache in caches]
    return out


def assert_same(model: Any, atol: float, fused: Any = None) -> None:
    """The flattened forward (with `fused` layers when given) against the separate ones."""
    import mlx.core as mx

    ref_decode, ref_firsts, ref_batch, ref_caches = separate(model)
    decode, firsts, batch, caches = flattened(model, fused)
    assert decode.shape == ref_decode.shape
    assert mx.allclose(decode, ref_decode, atol=atol, rtol=1e-4).item()
    assert len(firsts) == len(ref_firsts) == sum(ENDING)
    for got, want in zip(firsts, ref_firsts, strict=True):
        assert mx.allclose(got, want, atol=atol, rtol=1e-4).item()
    pairs = zip(
        next_logits(model, batch, caches), next_logits(model, ref_batch, ref_caches), strict=True
    )
    for got, want in pairs:
        assert mx.allclose(got, want, atol=atol, rtol=1e-4).item()


def random_model(module: str, **extra: Any) -> Any:
    """A small random model of an mlx-lm architecture (GQA, several layers)."""
    import importlib

    import mlx.core as mx

    arch = importlib.import_module(f"mlx_lm.models.{module}")
    args = arch.ModelArgs.from_dict(
        {
            "model_type": module,
            "hidden_size": 64,
            "num_hidden_layers": 2,
            "intermediate_size": 96,
            "num_attention_heads": 4,
            "num_key_value_heads": 2,
            "rms_norm_eps": 1e-6,
            "vocab_size": 64,
            "head_dim": 16,
            "tie_word_embeddings": False,
            **extra,
        }
    )
    mx.random.seed(7)
    model = arch.Model(args)
    mx.eval(model.parameters())
    return model


MODELS: dict[str, Callable[[], Any]] = {
    "llama": lambda: random_model("llama"),
    "qwen3": lambda: random_model("qwen3", max_position_embeddings=512, rope_theta=10000.0),
}


def load_folder(path: Path) -> Any:
    from mlx_lm.utils import load

    from mlxcel.model.native.cpu_forms import install_cpu_forms
    from mlxcel.model.native.qmm import install_quantized_forms

    model = load(str(path))[0]
    install_cpu_forms(model)
    install_quantized_forms(model)
    return model


def test_the_tiny_model_gets_the_same_logits_and_states() -> None:
    from mlxcel.model import flat_forward

    model = load_folder(ensure_tiny_model())
    assert flat_forward.supports(model)
    assert_same(model, atol=1e-4)


@pytest.mark.parametrize("name", sorted(MODELS))
def test_other_architectures_get_the_same_logits_and_states(name: str) -> None:
    from mlxcel.model import flat_forward

    model = MODELS[name]()
    assert flat_forward.supports(model)
    assert_same(model, atol=1e-4)


def test_a_model_with_sliding_window_layers_is_not_flattened() -> None:
    from mlxcel.model import flat_forward

    model = random_model(
        "llama", layer_types=["sliding_attention", "full_attention"], sliding_window=8
    )
    assert not flat_forward.supports(model)


@pytest.mark.slow
def test_the_real_model_gets_the_same_logits_and_states() -> None:
    path = default_model_dir()
    assert is_ready(path), "the default model is fetched by the test command's set-up"
    model = load_folder(path)
    assert_same(model, atol=5e-4)
    from mlxcel.model.native.fused_layer import plan_layers

    assert_same(model, atol=5e-4, fused=plan_layers(model))


def quantized(model: Any) -> Any:
    """`model` with 4-bit weights (the fused layers take quantized ones only)."""
    import mlx.core as mx
    import mlx.nn as nn

    from mlxcel.model.native.qmm import install_quantized_forms

    nn.quantize(model, group_size=32, bits=4)
    install_quantized_forms(model)
    mx.eval(model.parameters())
    return model


@pytest.mark.parametrize("name", ["tiny", *sorted(MODELS)])
def test_the_fused_layers_give_the_same_logits_and_states(name: str) -> None:
    """Decode rows beside a chunk, and the next steps from the states they leave."""
    from mlxcel.model.native.fused_layer import plan_layers

    model = quantized(load_folder(ensure_tiny_model()) if name == "tiny" else MODELS[name]())
    assert_same(model, atol=1e-4, fused=plan_layers(model))
