"""GGUF -> MLX conversion on small synthetic GGUF files written with `gguf.GGUFWriter`."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import pytest
from tokenizers import Tokenizer

from mlxcel.model.provision.fetch import default_model_dir, is_ready
from mlxcel.model.provision.gguf_convert import convert_gguf

from tiny_gguf import HEADS, HIDDEN, INTER, KV_HEADS, LAYERS, TEMPLATE, vocab, write_gguf

Array = npt.NDArray[np.float32]


def _load_weights(folder: Path) -> dict[str, Array]:
    from mlxcel.model.native.blas import load_fast_blas

    load_fast_blas()
    import mlx.core as mx

    loaded = mx.load(str(folder / "model.safetensors"))
    assert isinstance(loaded, dict)
    return {k: np.array(v.astype(mx.float32)) for k, v in loaded.items()}


def _config(folder: Path, name: str = "config.json") -> dict[str, Any]:
    data = json.loads((folder / name).read_text(encoding="utf-8"))
    assert isinstance(data, dict)
    return data


def test_qwen2_names_shapes_values_round_trip(tmp_path: Path) -> None:
    expected = write_gguf(tmp_path / "m.gguf")
    convert_gguf(tmp_path / "m.gguf", tmp_path / "out", progress=False)
    weights = _load_weights(tmp_path / "out")
    assert set(weights) == set(expected)
    for name, want in expected.items():
        got = weights[name]
        assert got.shape == want.shape, name
        assert got.dtype == np.float32
        if name.endswith(("q_proj.weight", "up_proj.weight")):  # Q8_0: ~1% error
            np.testing.assert_allclose(got, want, atol=0.01 * float(np.abs(want).max()) + 1e-3)
        elif name.endswith(("embed_tokens.weight", "down_proj.weight")):  # F16
            np.testing.assert_allclose(got, want, rtol=1e-3, atol=1e-4)
        else:
            np.testing.assert_array_equal(got, want)
    config = _config(tmp_path / "out")
    tokens, _ = vocab()
    assert config["model_type"] == "qwen2"
    assert config["tie_word_embeddings"] is True
    assert (config["hidden_size"], config["num_hidden_layers"]) == (HIDDEN, LAYERS)
    assert (config["num_attention_heads"], config["num_key_value_heads"]) == (HEADS, KV_HEADS)
    assert config["intermediate_size"] == INTER
    assert config["vocab_size"] == len(tokens)
    assert config["max_position_embeddings"] == 4096
    assert config["rope_theta"] == 1_000_000.0
    assert config["eos_token_id"] == [tokens.index("<|im_end|>"), tokens.index("<|endoftext|>")]


def test_llama_qk_are_unpermuted_and_untied_head_kept(tmp_path: Path) -> None:
    expected = write_gguf(tmp_path / "m.gguf", arch="llama", head="distinct")
    convert_gguf(tmp_path / "m.gguf", tmp_path / "out", progress=False)
    weights = _load_weights(tmp_path / "out")
    for i in range(LAYERS):
        for proj in ("q_proj", "k_proj"):
            name = f"model.layers.{i}.self_attn.{proj}.weight"
            np.testing.assert_array_equal(weights[name], expected[name])
    np.testing.assert_array_equal(weights["lm_head.weight"], expected["lm_head.weight"])
    config = _config(tmp_path / "out")
    assert config["model_type"] == "llama"
    assert config["tie_word_embeddings"] is False


def test_head_that_copies_the_embedding_is_stored_once(tmp_path: Path) -> None:
    expected = write_gguf(tmp_path / "m.gguf", head="copy")
    convert_gguf(tmp_path / "m.gguf", tmp_path / "out", progress=False)
    weights = _load_weights(tmp_path / "out")
    assert "lm_head.weight" not in weights
    assert _config(tmp_path / "out")["tie_word_embeddings"] is True
    want = expected["model.embed_tokens.weight"]
    # taken from the more precise F32 head, not the F16 embedding
    np.testing.assert_array_equal(weights["model.embed_tokens.weight"], want)


def test_bfloat16_output(tmp_path: Path) -> None:
    expected = write_gguf(tmp_path / "m.gguf")
    convert_gguf(tmp_path / "m.gguf", tmp_path / "out", dtype="bfloat16", progress=False)
    got = _load_weights(tmp_path / "out")["model.norm.weight"]
    np.testing.assert_allclose(got, expected["model.norm.weight"], rtol=1 / 128)
    with pytest.raises(ValueError, match="dtype"):
        convert_gguf(tmp_path / "m.gguf", tmp_path / "bad", dtype="int4", progress=False)


def test_tokenizer_rebuilt_from_gguf_vocabulary(tmp_path: Path) -> None:
    write_gguf(tmp_path / "m.gguf")
    convert_gguf(tmp_path / "m.gguf", tmp_path / "out", progress=False)
    tokens, _ = vocab()
    tok = Tokenizer.from_file(str(tmp_path / "out" / "tokenizer.json"))
    ids = tok.encode("<|im_start|>hello world<|im_end|>", add_special_tokens=False).ids
    assert ids == [
        tokens.index(t) for t in ["<|im_start|>", "hello", "Ġw", "o", "r", "l", "d", "<|im_end|>"]
    ]
    assert tok.encode("<tool_call>", add_special_tokens=False).ids == [tokens.index("<tool_call>")]
    assert tok.decode(ids, skip_special_tokens=True) == "hello world"
    assert tok.token_to_id("[PAD0]") is None  # unused padding entries are dropped
    special = {t.content for t in tok.get_added_tokens_decoder().values() if t.special}
    assert special == {"<|endoftext|>", "<|im_start|>", "<|im_end|>"}
    tok_config = _config(tmp_path / "out", "tokenizer_config.json")
    assert tok_config["chat_template"] == TEMPLATE
    assert tok_config["eos_token"] == "<|im_end|>"
    assert tok_config["tokenizer_class"] == "PreTrainedTokenizerFast"


@pytest.mark.mlx
def test_converted_folder_loads_and_generates_in_mlx_lm(tmp_path: Path) -> None:
    write_gguf(tmp_path / "m.gguf")
    convert_gguf(tmp_path / "m.gguf", tmp_path / "out", progress=False)
    _load_weights(tmp_path / "out")  # fast BLAS before mlx_lm imports mlx
    import mlx_lm
    from mlx_lm.sample_utils import make_sampler

    loaded: Any = mlx_lm.load(str(tmp_path / "out"))
    model, tokenizer = loaded[:2]
    prompt = tokenizer.apply_chat_template(
        [{"role": "user", "content": "hello"}], add_generation_prompt=True, tokenize=False
    )
    assert prompt == "<|im_start|>user\nhello<|im_end|>\n<|im_start|>assistant\n"
    out = mlx_lm.generate(model, tokenizer, prompt, max_tokens=4, sampler=make_sampler(temp=0.0))
    assert isinstance(out, str)


@pytest.mark.slow  # the default model's files
@pytest.mark.skipif(not is_ready(default_model_dir()), reason="default model not fetched")
def test_real_default_model_tokenizer() -> None:
    folder = default_model_dir()
    tok = Tokenizer.from_file(str(folder / "tokenizer.json"))
    for text, want in [("<|im_start|>", [151644]), ("<|im_end|>", [151645]),
                       ("<|endoftext|>", [151643]), ("<tool_call>", [151657]),
                       ("Hello world", [9707, 1879])]:  # fmt: skip
        assert tok.encode(text, add_special_tokens=False).ids == want, text
    config = _config(folder)
    assert config["model_type"] == "qwen2"
    assert {151643, 151645} <= set(config["eos_token_id"])
    assert "<|im_start|>" in _config(folder, "tokenizer_config.json")["chat_template"]
