"""The fused layer: its head and tail compute what the layer's own modules compute.

On quantized models of the three architectures the flattened forward runs (the tiny qwen2
with its QKV biases, llama with traditional and scaled RoPE and biases on every map, qwen3
with its per-head norms), at odd token counts and positions, on every build of the kernels
this CPU runs (the AVX-512 build takes the tile path from five tokens up where the CPU has
AMX). The reference is mlx-lm's modules on MLX's own quantized matmul. Then which layer a
model gets, and the one log line that says so.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from types import ModuleType
from typing import Any

import pytest

from mlxcel.model.native.blas import load_fast_blas

load_fast_blas()  # before mlx.core is first imported

import mlx.core as mx  # noqa: E402
import mlx.nn as nn  # noqa: E402

from mlxcel.model.native.build import probe  # noqa: E402
from mlxcel.model.native.fused_layer import (  # noqa: E402
    SWITCH,
    FusedLayers,
    choose,
    plan_layers,
)
from mlxcel.model.native.kernels import load_kernels  # noqa: E402

from tiny_model import ensure_tiny_model  # noqa: E402

pytestmark = pytest.mark.mlx

ISAS = [isa for isa in ("avx512", "avx2") if probe().runs(isa)] + ["generic"]


def random_model(module: str, **extra: Any) -> Any:
    """A small random model of an mlx-lm architecture (GQA, two layers)."""
    import importlib

    arch = importlib.import_module(f"mlx_lm.models.{module}")
    args = arch.ModelArgs.from_dict(
        {
            "model_type": module,
            "hidden_size": 64,
            "num_hidden_layers": 2,
            "intermediate_size": 128,
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


def quantized(model: Any, bits: int, group: int, wide: int = 8) -> Any:
    """`model` quantized as the default model is: `wide` bits for v_proj and down_proj."""

    def predicate(path: str, module: Any) -> bool | dict[str, Any]:
        if not isinstance(module, nn.Linear):
            return False
        wider = path.endswith(("v_proj", "down_proj"))
        return {"group_size": group, "bits": wide if wider else bits, "mode": "affine"}

    nn.quantize(model, class_predicate=predicate)
    mx.eval(model.parameters())
    return model


def tiny_qwen2() -> Any:
    from mlx_lm.utils import load

    return quantized(load(str(ensure_tiny_model()))[0], bits=4, group=32)


MODELS: dict[str, Callable[[], Any]] = {
    "qwen2": tiny_qwen2,
    "llama": lambda: quantized(
        random_model(
            "llama",
            rope_traditional=True,
            rope_scaling={"type": "linear", "factor": 2.0},
            attention_bias=True,
            mlp_bias=True,
        ),
        bits=8,
        group=64,
        wide=8,
    ),
    "qwen3": lambda: quantized(
        random_model("qwen3", max_position_embeddings=4096, rope_theta=10000.0), bits=3, group=32
    ),
}


@pytest.fixture(scope="module", params=sorted(MODELS))
def model(request: pytest.FixtureRequest) -> Any:
    assert load_kernels().available
    return MODELS[request.param]()


@pytest.fixture(scope="module", params=ISAS)
def ext(request: pytest.FixtureRequest, kernels_for: Callable[[str], ModuleType]) -> ModuleType:
    return kernels_for(request.param)


def reference_head(layer: Any, h: mx.array, positions: list[int]) -> list[mx.array]:
    """q, k, v `[T, heads, D]` by the layer's modules, each token rotated at its position."""
    attn = layer.self_attn
    x = layer.input_layernorm(h)
    q, k, v = attn.q_proj(x), attn.k_proj(x), attn.v_proj(x)
    t = h.shape[0]
    q = q.reshape(t, attn.n_heads, -1)
    k, v = (a.reshape(t, attn.n_kv_heads, -1) for a in (k, v))
    if hasattr(attn, "q_norm"):
        q, k = attn.q_norm(q), attn.k_norm(k)
    # RoPE reads the second-to-last axis as positions: each token's heads as [heads, 1, D]
    q, k = (
        mx.stack([attn.rope(a[i][:, None], offset=p)[:, 0] for i, p in enumerate(positions)])
        for a in (q, k)
    )
    return [q, k, v]


def reference_tail(layer: Any, h: mx.array, attn_out: mx.array) -> mx.array:
    h = h + layer.self_attn.o_proj(attn_out)
    out: mx.array = h + layer.mlp(layer.post_attention_layernorm(h))
    return out


def close(got: mx.array, want: mx.array) -> bool:
    return got.shape == want.shape and bool(mx.allclose(got, want, rtol=1e-4, atol=2e-4).item())


@pytest.mark.parametrize("tokens", [1, 3, 8, 17])
def test_head_and_tail_equal_the_layer_modules(model: Any, ext: ModuleType, tokens: int) -> None:
    fused = FusedLayers(plan_layers(model).layers, ext)
    key = mx.random.key(tokens)
    positions = [(0, 1, 4095, 150, 7)[i % 5] + i for i in range(tokens)]
    for index, layer in enumerate(model.model.layers):
        h = mx.random.normal((tokens, 64), key=mx.random.split(key)[0]) * 2
        attn_out = mx.random.normal((tokens, 64), key=mx.random.split(key)[1])
        got = fused.head(index, h, mx.array(positions, dtype=mx.int32))
        for g, w in zip(got, reference_head(layer, h, positions), strict=True):
            assert close(g, w)
        assert close(fused.tail(index, h, attn_out), reference_tail(layer, h, attn_out))


def test_a_view_is_read_as_its_elements(model: Any) -> None:
    """A transposed or sliced input (not row-contiguous) gives what its copy gives."""
    fused = plan_layers(model)
    wide = mx.random.normal((64, 6), key=mx.random.key(3))
    h, attn_out = wide.T, mx.random.normal((6, 128), key=mx.random.key(4))[:, ::2]
    positions = mx.arange(0, 12, dtype=mx.int32)[::2]
    got = fused.head(0, h, positions)
    want = fused.head(0, mx.array(h.tolist()), mx.array(positions.tolist(), dtype=mx.int32))
    assert all(close(g, w) for g, w in zip(got, want, strict=True))
    assert close(fused.tail(0, h, attn_out), fused.tail(0, mx.array(h.tolist()), attn_out * 1))


def test_shapes_it_does_not_take_are_refused_when_the_node_is_built(model: Any) -> None:
    fused = plan_layers(model)
    h = mx.zeros((2, 64))
    with pytest.raises(ValueError, match="positions"):
        fused.head(0, h, mx.zeros((3,), dtype=mx.int32))
    with pytest.raises(ValueError, match="h and attn"):
        fused.tail(0, h, mx.zeros((3, 64)))
    with pytest.raises(ValueError, match="float32"):
        fused.tail(0, h.astype(mx.float16), mx.zeros((2, 64)))


def test_the_switch_and_the_log_line(
    model: Any, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="mlxcel.model.native.fused_layer")
    monkeypatch.setenv(SWITCH, "1")
    assert choose(model, flat=True) is not None
    assert choose(model, flat=False) is None
    monkeypatch.setenv(SWITCH, "0")
    assert choose(model, flat=True) is None
    monkeypatch.delenv(SWITCH)
    assert choose(model, flat=True) is None
    lines = [r.getMessage() for r in caplog.records]
    assert lines[0].startswith("Layers: fused (one native head and tail per layer, 2 layers)")
    assert "does not apply: its blocks are not ones the flattened forward runs" in lines[1]
    assert lines[2] == f"Layers: composed MLX operations ({SWITCH}=0)"
    assert lines[3] == f"Layers: composed MLX operations (the default; {SWITCH}=1 fuses)"
    assert len(lines) == 4


def test_an_unquantized_model_keeps_the_composed_layer(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="mlxcel.model.native.fused_layer")
    monkeypatch.setenv(SWITCH, "1")
    assert choose(random_model("llama"), flat=True) is None
    assert "its projections are not affine-quantized" in caplog.records[-1].getMessage()


def test_without_the_kernels_the_composed_layer_runs(
    model: Any, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    from mlxcel.model.native import fused_layer

    caplog.set_level(logging.INFO, logger="mlxcel.model.native.fused_layer")
    monkeypatch.setenv(SWITCH, "1")
    monkeypatch.setattr(fused_layer, "current_module", lambda: None)
    assert choose(model, flat=True) is None
    assert "the CPU kernels are not loaded" in caplog.records[-1].getMessage()
