"""Tiny GGUF files for the converter tests, written with `gguf.GGUFWriter`.

A byte-level BPE vocabulary, a chat template and two layers of random weights,
stored as F32/F16 or in llama.cpp's quantised block layouts: quantised with
`gguf.quants.quantize`, or (for the types it cannot quantise, such as the
K-quants) as raw blocks with random fields, never through the code under test.
"""

from __future__ import annotations

from pathlib import Path

import gguf
import numpy as np
import numpy.typing as npt
from gguf import GGML_QUANT_SIZES, TokenType
from gguf import GGMLQuantizationType as Q

Array = npt.NDArray[np.float32]

# INTER is a whole K-quant super-block (256), so down_proj can be Q4_K or Q6_K.
HIDDEN, HEADS, KV_HEADS, INTER, LAYERS = 64, 4, 2, 256, 2
HEAD_DIM = HIDDEN // HEADS
SPECIALS = {"<|endoftext|>": TokenType.CONTROL, "<|im_start|>": TokenType.CONTROL,
            "<|im_end|>": TokenType.CONTROL, "<tool_call>": TokenType.USER_DEFINED}  # fmt: skip
MERGES = ["h e", "l l", "he ll", "hell o", "Ġ w"]
TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)

#: The float16 fields of each block layout: (byte offset, magnitude), chosen so the
#: weights come out around 0.05 like the float ones; every other byte is random.
HALF_FIELDS: dict[Q, tuple[tuple[int, float], ...]] = {
    Q.Q8_0: ((0, 8e-4),),
    Q.Q4_0: ((0, 1e-2),),
    Q.Q5_0: ((0, 5e-3),),
    Q.Q4_1: ((0, 1e-2), (2, 8e-2)),
    Q.Q5_1: ((0, 5e-3), (2, 8e-2)),
    Q.Q4_K: ((0, 1e-4), (2, 1e-3)),  # d, dmin
    Q.Q5_K: ((0, 5e-5), (2, 1e-3)),
    Q.Q6_K: ((208, 2e-5),),  # ql 128, qh 64, int8 scales 16, then d
    Q.IQ4_NL: ((0, 5e-4),),
}


def random_blocks(
    rng: np.random.Generator, qtype: Q, rows: int, cols: int
) -> npt.NDArray[np.uint8]:
    """``rows`` rows of raw ``qtype`` blocks: random bytes, random finite float16 fields."""
    block_elems, block_bytes = GGML_QUANT_SIZES[qtype]
    n = rows * cols // block_elems
    raw = rng.integers(0, 256, (n, block_bytes), dtype=np.uint8)
    for offset, size in HALF_FIELDS[qtype]:
        half = rng.uniform(0.25, 1.0, n) * rng.choice([-1.0, 1.0], n) * size
        raw[:, offset : offset + 2] = half.astype("<f2").view(np.uint8).reshape(n, 2)
    return raw.reshape(rows, -1)


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


def vocab() -> tuple[list[str], list[TokenType]]:
    tokens = _byte_tokens() + [m.replace(" ", "") for m in MERGES]
    types = [TokenType.NORMAL] * len(tokens)
    for token, kind in SPECIALS.items():
        tokens.append(token)
        types.append(kind)
    tokens.append("[PAD0]")
    types.append(TokenType.UNUSED)
    return tokens, types


def permute(w: Array, n_head: int) -> Array:
    """llama.cpp's Q/K row interleaving for the llama architecture."""
    return (
        w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:])
        .swapaxes(1, 2)
        .reshape(w.shape)
    )


def unpermute(w: Array, n_head: int) -> Array:
    return (
        w.reshape(n_head, w.shape[0] // n_head // 2, 2, *w.shape[1:])
        .swapaxes(1, 2)
        .reshape(w.shape)
    )


#: ``mix=True``: the GGUF type of each layer matrix, per layer (qwen2, llama).
MIX = {
    "attn_q": ((Q.Q8_0, Q.Q8_0), (Q.Q4_1, Q.Q4_1)),
    "attn_k": ((Q.Q5_0, Q.Q5_0), (Q.Q5_1, Q.Q5_1)),
    # IQ4_NL has no MLX re-packing: that matrix stays float.
    "attn_v": ((Q.Q4_0, Q.IQ4_NL), (Q.Q4_0, Q.IQ4_NL)),
    "attn_output": ((Q.Q5_1, Q.Q4_1), (Q.Q8_0, Q.Q5_0)),
    "ffn_gate": ((Q.Q4_1, Q.Q4_0), (Q.Q4_1, Q.Q4_0)),
    "ffn_up": ((Q.Q8_0, Q.Q5_0), (Q.Q8_0, Q.Q5_0)),
    "ffn_down": ((Q.Q4_K, Q.Q6_K), (Q.Q5_K, Q.Q6_K)),
}
_RAW = (Q.Q4_K, Q.Q5_K, Q.Q6_K, Q.IQ4_NL)


def write_gguf(
    path: Path, arch: str = "qwen2", head: str = "tied", mix: bool = False
) -> dict[str, Array]:
    """A tiny model GGUF; returns the intended Hugging Face layout weights by HF name.

    ``head``: ``tied`` (no output.weight), ``distinct`` (its own matrix) or
    ``copy`` (the embedding again at another quantisation, as llama.cpp
    writes tied models). ``mix``: every matrix block-quantised as in
    :data:`MIX` (the embedding Q5_0, a copied head Q8_0), llama's Q/K
    quantised after the row interleaving as llama.cpp does.
    """
    rng = np.random.default_rng(7)
    tokens, types = vocab()
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

    def add_raw(gguf_name: str, hf_name: str, qtype: Q, rows: int, cols: int) -> None:
        raw = random_blocks(rng, qtype, rows, cols)
        writer.add_tensor(gguf_name, raw, raw_dtype=qtype)
        expected[hf_name] = gguf.quants.dequantize(raw, qtype).astype(np.float32)

    def rand(*shape: int) -> Array:
        return rng.normal(0, 0.05, shape).astype(np.float32)

    def matrix(i: int, kind: str, hf_name: str, rows: int, cols: int, n_head: int = 0) -> None:
        qtype = MIX[kind][arch == "llama"][i] if mix else Q.F32
        if qtype in _RAW:
            add_raw(f"blk.{i}.{kind}.weight", hf_name, qtype, rows, cols)
        else:
            value = rand(rows, cols)
            stored = permute(value, n_head) if n_head else None
            add(f"blk.{i}.{kind}.weight", hf_name, value, qtype, stored)

    embed_type = Q.Q5_0 if mix else Q.F16
    add("token_embd.weight", "model.embed_tokens.weight", rand(len(tokens), HIDDEN), embed_type)
    kv = KV_HEADS * HEAD_DIM
    for i in range(LAYERS):
        hf = f"model.layers.{i}"
        add(f"blk.{i}.attn_norm.weight", f"{hf}.input_layernorm.weight", 1 + rand(HIDDEN))
        add(f"blk.{i}.ffn_norm.weight", f"{hf}.post_attention_layernorm.weight", 1 + rand(HIDDEN))
        if arch == "llama":  # stored permuted; F32 unless mixed, so the round trip is exact
            matrix(i, "attn_q", f"{hf}.self_attn.q_proj.weight", HIDDEN, HIDDEN, HEADS)
            matrix(i, "attn_k", f"{hf}.self_attn.k_proj.weight", kv, HIDDEN, KV_HEADS)
        else:
            q = rand(HIDDEN, HIDDEN)
            add(f"blk.{i}.attn_q.weight", f"{hf}.self_attn.q_proj.weight", q, Q.Q8_0)
            matrix(i, "attn_k", f"{hf}.self_attn.k_proj.weight", kv, HIDDEN)
            for name, size in (("q", HIDDEN), ("k", kv), ("v", kv)):
                add(f"blk.{i}.attn_{name}.bias", f"{hf}.self_attn.{name}_proj.bias", rand(size))
        matrix(i, "attn_v", f"{hf}.self_attn.v_proj.weight", kv, HIDDEN)
        matrix(i, "attn_output", f"{hf}.self_attn.o_proj.weight", HIDDEN, HIDDEN)
        matrix(i, "ffn_gate", f"{hf}.mlp.gate_proj.weight", INTER, HIDDEN)
        up_type = MIX["ffn_up"][arch == "llama"][i] if mix else Q.Q8_0
        add(f"blk.{i}.ffn_up.weight", f"{hf}.mlp.up_proj.weight", rand(INTER, HIDDEN), up_type)
        if mix:
            matrix(i, "ffn_down", f"{hf}.mlp.down_proj.weight", HIDDEN, INTER)
        else:
            add(
                f"blk.{i}.ffn_down.weight", f"{hf}.mlp.down_proj.weight", rand(HIDDEN, INTER), Q.F16
            )
    add("output_norm.weight", "model.norm.weight", 1 + rand(HIDDEN))
    if head == "distinct":
        add("output.weight", "lm_head.weight", rand(len(tokens), HIDDEN))
    elif head == "copy":  # the head is the more precise copy: F32 (or Q8_0) over F16 (or Q5_0)
        embedding = expected["model.embed_tokens.weight"]
        if mix:
            writer.add_tensor(
                "output.weight", gguf.quants.quantize(embedding, Q.Q8_0), raw_dtype=Q.Q8_0
            )
        else:
            writer.add_tensor("output.weight", embedding)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return expected
