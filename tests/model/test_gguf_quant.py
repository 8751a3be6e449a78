"""GGUF -> MLX quantised conversion: llama.cpp's blocks re-packed into MLX's affine groups.

The reference for llama.cpp's layouts is `gguf.quants.dequantize`; MLX's own
`mx.dequantize` reads the re-packed weights, so both ends are independent of
the code under test. Blocks are raw bytes with random fields.
"""

from __future__ import annotations

import json
import logging
import time
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import pytest
from gguf import GGMLQuantizationType as Q
from gguf import GGUFReader
from gguf.quants import dequantize

from mlxcel.model.native.blas import load_fast_blas
from mlxcel.model.provision.fetch import DEFAULT_MODEL, ensure_default_model, ensure_model
from mlxcel.model.provision.gguf_convert import convert_gguf
from mlxcel.model.provision.gguf_quant import dequantize_groups, mlx_bits, pack, repack

from parity_prompts import SYSTEM, TEXTS
from tiny_gguf import INTER, random_blocks, vocab, write_gguf

Array = npt.NDArray[Any]

#: What each GGUF type becomes (stated here, not read from the code under test).
BITS = {Q.Q8_0: 8, Q.Q5_0: 5, Q.Q5_1: 5, Q.Q4_0: 4, Q.Q4_1: 4, Q.Q4_K: 4, Q.Q5_K: 5, Q.Q6_K: 8}
EXACT = [Q.Q8_0, Q.Q5_0, Q.Q5_1, Q.Q4_0, Q.Q4_1, Q.Q4_K, Q.Q5_K]
ROWS, COLS = 24, 512


def mx_dequantize(weight: Array, scales: Array, biases: Array, bits: int) -> Array:
    load_fast_blas()
    import mlx.core as mx

    values = mx.dequantize(
        mx.array(weight), mx.array(scales), mx.array(biases), group_size=32, bits=bits
    )
    return np.array(values)


@pytest.mark.parametrize("bits", [3, 4, 5, 6, 8])
def test_packing_is_the_packing_of_mx_quantize(bits: int) -> None:
    load_fast_blas()
    import mlx.core as mx

    w = np.random.default_rng(bits).normal(size=(8, 256)).astype(np.float32)
    packed, scales, biases = mx.quantize(mx.array(w), group_size=32, bits=bits)
    values = np.array(mx.dequantize(packed, scales, biases, group_size=32, bits=bits))
    s, b = np.array(scales)[..., None], np.array(biases)[..., None]
    q = np.rint((values.reshape(8, -1, 32) - b) / s).astype(np.uint8).reshape(8, 256)
    assert q.max() == 2**bits - 1  # the full range is exercised
    np.testing.assert_array_equal(pack(q, bits), np.array(packed))
    assert pack(q, bits).shape == (8, 256 * bits // 32)
    np.testing.assert_allclose(
        dequantize_groups(pack(q, bits), s[..., 0], b[..., 0], bits), values, rtol=0, atol=1e-5
    )


@pytest.mark.parametrize("qtype", EXACT, ids=lambda q: q.name)
def test_exact_types_keep_every_value(qtype: Q) -> None:
    raw = random_blocks(np.random.default_rng(int(qtype)), qtype, ROWS, COLS)
    want = dequantize(raw, qtype)
    weight, scales, biases, bits = repack(raw, qtype, (ROWS, COLS))
    assert bits == BITS[qtype] == mlx_bits(qtype)
    assert (weight.dtype, scales.dtype, biases.dtype) == (np.uint32, np.float32, np.float32)
    assert weight.shape == (ROWS, COLS * bits // 32)
    assert scales.shape == biases.shape == (ROWS, COLS // 32)
    # One rounding of the same exact products on both sides: bit for bit.
    np.testing.assert_array_equal(mx_dequantize(weight, scales, biases, bits), want)


def test_q6_k_is_requantised_to_8_bits_within_half_a_step() -> None:
    raw = random_blocks(np.random.default_rng(6), Q.Q6_K, ROWS, COLS)
    want = dequantize(raw, Q.Q6_K).reshape(ROWS, -1, 32)
    weight, scales, biases, bits = repack(raw, Q.Q6_K, (ROWS, COLS))
    assert bits == 8
    got = mx_dequantize(weight, scales, biases, bits).reshape(ROWS, -1, 32)
    span = want.max(axis=-1) - want.min(axis=-1)
    np.testing.assert_allclose(scales, span / 255, rtol=1e-6)  # the grid spans each group
    error = np.abs(got - want)
    # Half an 8-bit step, plus float32 rounding at the group's magnitude.
    bound = 0.5 * scales[..., None] + 4 * np.spacing(np.abs(want).max(axis=-1, keepdims=True))
    assert (error <= bound).all()
    # About an eighth of Q6_K's own step (d * scale of the coarser 16-value half).
    d = raw.reshape(-1, 210)[:, 208:210].copy().view("<f2").astype(np.float32)
    sub = np.abs(raw.reshape(-1, 210)[:, 192:208].view(np.int8).astype(np.float32) * d)
    coarser = sub.reshape(ROWS, -1, 2).max(axis=-1)
    assert (error.max(axis=-1) <= coarser * (63 / 255 / 2) * (1 + 1e-5)).all()


def test_types_without_a_repacking_are_refused() -> None:
    for qtype in (Q.IQ4_NL, Q.Q2_K, Q.F32):
        assert mlx_bits(qtype) is None
    raw = random_blocks(np.random.default_rng(1), Q.IQ4_NL, 4, 64)
    with pytest.raises(ValueError, match="no MLX re-packing"):
        repack(raw, Q.IQ4_NL, (4, 64))


def _module_types(gguf_path: Path) -> dict[str, Q]:
    """HF module path -> GGUF type of its matrix, read straight from the file."""
    names = {"attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj",
             "attn_v": "self_attn.v_proj", "attn_output": "self_attn.o_proj",
             "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj", "ffn_down": "mlp.down_proj"}  # fmt: skip
    found = {}
    for t in GGUFReader(gguf_path).tensors:
        parts = t.name.split(".")
        if parts[0] == "blk" and parts[2] in names and parts[3] == "weight":
            found[f"model.layers.{parts[1]}.{names[parts[2]]}"] = t.tensor_type
        elif t.name == "output.weight":  # the more precise copy serves as the embedding
            found["model.embed_tokens"] = t.tensor_type
    return found


@pytest.mark.mlx
@pytest.mark.parametrize("arch", ["qwen2", "llama"])
def test_quantized_folder_loads_in_mlx_lm_and_matches_float32(
    tmp_path: Path, arch: str, caplog: pytest.LogCaptureFixture
) -> None:
    write_gguf(tmp_path / "m.gguf", arch=arch, head="copy", mix=True)
    with caplog.at_level(logging.INFO):
        convert_gguf(tmp_path / "m.gguf", tmp_path / "q", progress=False, keep_quantized=True)
    assert "model.layers.1.self_attn.v_proj.weight: no MLX re-packing for IQ4_NL" in caplog.text
    convert_gguf(tmp_path / "m.gguf", tmp_path / "f", progress=False)
    load_fast_blas()
    import mlx.core as mx
    import mlx.nn as nn
    import mlx_lm

    types = _module_types(tmp_path / "m.gguf")
    config = json.loads((tmp_path / "q" / "config.json").read_text())
    block = config["quantization"]
    assert block == config["quantization_config"]
    assert config["tie_word_embeddings"] is True
    bits = {m: BITS[t] for m, t in types.items() if t in BITS}
    default = max(set(bits.values()), key=list(bits.values()).count)
    assert {k: block[k] for k in ("group_size", "bits", "mode")} == {
        "group_size": 32, "bits": default, "mode": "affine"}  # fmt: skip
    overrides = {k: v for k, v in block.items() if isinstance(v, dict)}
    assert overrides == {
        m: {"group_size": 32, "bits": b, "mode": "affine"} for m, b in bits.items() if b != default
    }

    stored = mx.load(str(tmp_path / "q" / "model.safetensors"))
    floats = mx.load(str(tmp_path / "f" / "model.safetensors"))
    assert isinstance(stored, dict)
    assert isinstance(floats, dict)
    for module, qtype in types.items():
        want = np.array(floats[f"{module}.weight"])
        if module not in bits:  # kept float
            assert f"{module}.scales" not in stored
            np.testing.assert_array_equal(np.array(stored[f"{module}.weight"]), want)
            continue
        w, s, b = (stored[f"{module}.{k}"] for k in ("weight", "scales", "biases"))
        assert (w.dtype, s.dtype, b.dtype) == (mx.uint32, mx.float32, mx.float32)
        got = np.array(mx.dequantize(w, s, b, group_size=32, bits=bits[module]))
        if qtype == Q.Q6_K:
            half_step = np.repeat(np.array(s), 32, axis=-1) / 2
            assert (np.abs(got - want) <= half_step * (1 + 1e-5) + 1e-7).all(), module
        else:  # exact, llama's Q/K rows (weight, scales, biases) un-interleaved alike
            np.testing.assert_array_equal(got, want, err_msg=module)

    model: Any = mlx_lm.load(str(tmp_path / "q"))[0]
    reference: Any = mlx_lm.load(str(tmp_path / "f"))[0]
    modules = dict(model.named_modules())
    assert isinstance(modules["model.embed_tokens"], nn.QuantizedEmbedding)
    for module, width in bits.items():
        if module != "model.embed_tokens":
            assert isinstance(modules[module], nn.QuantizedLinear), module
        assert modules[module].bits == width, module
    assert type(model.model.layers[1].self_attn.v_proj) is nn.Linear  # IQ4_NL kept float
    ids = mx.array([list(range(0, len(vocab()[0]), 7))])
    got_logits, want_logits = np.array(model(ids)), np.array(reference(ids))
    scale = float(np.abs(want_logits).max())
    # Only the Q6_K down_proj differs (by at most half an 8-bit step per weight).
    assert float(np.abs(got_logits - want_logits).max()) <= 0.005 * scale
    assert INTER % 256 == 0  # the K-quant matrices above were whole super-blocks


def _greedy(model: Any, prompt: list[int], n: int) -> tuple[list[int], Array]:
    """``n`` greedy tokens and the logits that chose them. The tied head runs on those
    rows only: MLX's CPU quantised matmul is slow, and the head is a quarter of the work."""
    import mlx.core as mx
    from mlx_lm.models.cache import make_prompt_cache

    cache = make_prompt_cache(model)
    tokens, rows = [*prompt], []
    for _ in range(n):
        hidden = model.model(mx.array([tokens[-1:] if rows else tokens]), cache=cache)
        rows.append(np.array(model.model.embed_tokens.as_linear(hidden[0, -1])))
        tokens.append(int(np.argmax(rows[-1])))
    return tokens[len(prompt) :], np.stack(rows)


@pytest.mark.slow  # the default model at both precisions (fetched and converted once)
@pytest.mark.mlx
def test_real_default_model_quantized_matches_float32() -> None:
    load_fast_blas()
    import mlx_lm

    model: Any
    model, tokenizer = mlx_lm.load(str(ensure_default_model(progress=False)))[:2]
    reference: Any = mlx_lm.load(str(ensure_model(DEFAULT_MODEL.at("float32"), progress=False)))[0]
    assert model.args.tie_word_embeddings
    assert reference.args.tie_word_embeddings
    for text in TEXTS:
        messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": text}]
        prompt = tokenizer.apply_chat_template(messages, add_generation_prompt=True)
        start = time.perf_counter()
        ours, logits = _greedy(model, prompt, 4)
        took = time.perf_counter() - start
        theirs, want = _greedy(reference, prompt, 4)
        diverge = next(
            (k for k, (a, b) in enumerate(zip(ours, theirs, strict=True)) if a != b), None
        )
        assert ours == theirs, f"{text[:20]!r}: greedy diverges at token {diverge}"
        # Only Q6_K's 8-bit re-quantisation differs: ~0.08 on logits of magnitude ~30.
        difference = float(np.abs(logits - want).max())
        print(f"{len(prompt)} prompt tokens: logits differ by {difference:.4f}, {took:.1f} s")
        assert difference < 0.25
