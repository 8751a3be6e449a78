"""GGUF -> MLX conversion on small synthetic GGUF files written with `gguf.GGUFWriter`."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import gguf
import numpy as np
import numpy.typing as npt
import pytest
from gguf import GGMLQuantizationType as Q
from gguf import TokenType
from tokenizers import Tokenizer

from mlxcel.model.provision.fetch import default_model_dir, is_ready
from mlxcel.model.provision.gguf_convert import convert_gguf

Array = npt.NDArray[np.float32]

HIDDEN, HEADS, KV_HEADS, INTER, LAYERS = 64, 4, 2, 128, 2
HEAD_DIM = HIDDEN // HEADS
SPECIALS = {"<|endoftext|>": TokenType.CONTROL, "<|im_start|>": TokenType.CONTROL,
            "<|im_end|>": TokenType.CONTROL, "<tool_call>": TokenType.USER_DEFINED}  # fmt: skip
MERGES = ["h e", "l l", "he ll", "hell o", "Ġ w"]
TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def _byte_tokens() -> list[str]:
    """GPT-2's printable stand-ins for the 256 byte values."""
    keep = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), 256)]
    chars = dict(zip(keep, keep, strict=True))
    extra = 0
    for b in range(256):
        if b not in chars:
            chars[b] = 256 + extra
            extra += 1
    return [chr(chars[b]) for b in range(256)]


def _vocab() -> tuple[list[str], list[TokenType]]:
    tokens = _byte_tokens() + [m.replace(" ", "") for m in MERGES]
    types = [TokenType.NORMAL] * len(tokens)
    for token, kind in SPECIALS.items():
        tokens.append(token)
        types.append(kind)
    tokens.append("[PAD0]")
    types.append(TokenType.UNUSED)
    return tokens, types


def _permute(w: Array, n_head: int) -> Array:
    """llama.cpp's Q/K row interleaving for the llama architecture."""
    return (
        w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:])
        .swapaxes(1, 2)
        .reshape(w.shape)
    )


def write_gguf(path: Path, arch: str = "qwen2", head: str = "tied") -> dict[str, Array]:
    """A tiny model GGUF; returns the intended Hugging Face layout weights by HF name.

    ``head``: ``tied`` (no output.weight), ``distinct`` (its own matrix) or
    ``copy`` (the embedding again at another quantisation, as llama.cpp
    writes tied models).
    """
    rng = np.random.default_rng(7)
    tokens, types = _vocab()
    vocab = len(tokens)
    writer = gguf.GGUFWriter(str(path), arch)
    writer.add_block_count(LAYERS)
    writer.add_context_length(4096)
    writer.add_embedding_length(HIDDEN)
    writer.add_feed_forward_length(INTER)
    writer.add_head_count(HEADS)
    writer.add_head_count_kv(KV_HEADS)
    writer.add_layer_norm_rms_eps(1e-6)
    writer.add_rope_freq_base(1_000_000.0)
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("qwen2" if arch == "qwen2" else "smollm")
    writer.add_token_list(tokens)
    writer.add_token_types(types)
    writer.add_token_merges(MERGES)
    writer.add_bos_token_id(tokens.index("<|endoftext|>"))
    writer.add_eos_token_id(tokens.index("<|im_end|>"))
    writer.add_pad_token_id(tokens.index("<|endoftext|>"))
    writer.add_add_bos_token(False)
    writer.add_chat_template(TEMPLATE)

    expected: dict[str, Array] = {}

    def add(
        gguf_name: str, hf_name: str, value: Array, qtype: Q = Q.F32, stored: Array | None = None
    ) -> None:
        data = value if stored is None else stored
        if qtype == Q.F32:
            writer.add_tensor(gguf_name, data)
        elif qtype == Q.F16:
            writer.add_tensor(gguf_name, data.astype(np.float16))
        else:
            writer.add_tensor(gguf_name, gguf.quants.quantize(data, qtype), raw_dtype=qtype)
        expected[hf_name] = value

    def rand(*shape: int) -> Array:
        return rng.normal(0, 0.05, shape).astype(np.float32)

    add("token_embd.weight", "model.embed_tokens.weight", rand(vocab, HIDDEN), Q.F16)
    kv = KV_HEADS * HEAD_DIM
    for i in range(LAYERS):
        hf = f"model.layers.{i}"
        add(f"blk.{i}.attn_norm.weight", f"{hf}.input_layernorm.weight", 1 + rand(HIDDEN))
        add(f"blk.{i}.ffn_norm.weight", f"{hf}.post_attention_layernorm.weight", 1 + rand(HIDDEN))
        q, k = rand(HIDDEN, HIDDEN), rand(kv, HIDDEN)
        if arch == "llama":  # stored permuted, F32 so the round trip is exact
            add(
                f"blk.{i}.attn_q.weight",
                f"{hf}.self_attn.q_proj.weight",
                q,
                stored=_permute(q, HEADS),
            )
            add(
                f"blk.{i}.attn_k.weight",
                f"{hf}.self_attn.k_proj.weight",
                k,
                stored=_permute(k, KV_HEADS),
            )
        else:
            add(f"blk.{i}.attn_q.weight", f"{hf}.self_attn.q_proj.weight", q, Q.Q8_0)
            add(f"blk.{i}.attn_k.weight", f"{hf}.self_attn.k_proj.weight", k)
            for name, size in (("q", HIDDEN), ("k", kv), ("v", kv)):
                add(f"blk.{i}.attn_{name}.bias", f"{hf}.self_attn.{name}_proj.bias", rand(size))
        add(f"blk.{i}.attn_v.weight", f"{hf}.self_attn.v_proj.weight", rand(kv, HIDDEN))
        add(f"blk.{i}.attn_output.weight", f"{hf}.self_attn.o_proj.weight", rand(HIDDEN, HIDDEN))
        add(f"blk.{i}.ffn_gate.weight", f"{hf}.mlp.gate_proj.weight", rand(INTER, HIDDEN))
        add(f"blk.{i}.ffn_up.weight", f"{hf}.mlp.up_proj.weight", rand(INTER, HIDDEN), Q.Q8_0)
        add(f"blk.{i}.ffn_down.weight", f"{hf}.mlp.down_proj.weight", rand(HIDDEN, INTER), Q.F16)
    add("output_norm.weight", "model.norm.weight", 1 + rand(HIDDEN))
    if head == "distinct":
        add("output.weight", "lm_head.weight", rand(vocab, HIDDEN))
    elif head == "copy":  # F32 head, F16 embedding: the head is the more precise copy
        writer.add_tensor("output.weight", expected["model.embed_tokens.weight"])
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return expected


def _load_weights(folder: Path) -> dict[str, Array]:
    from mlxcel.model.blas import load_fast_blas

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
    tokens, _ = _vocab()
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
    tokens, _ = _vocab()
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
