"""Convert a llama.cpp GGUF file into an MLX model folder that ``mlx_lm.load`` reads.

Why not ``mlx_lm.convert``: it wants Hugging Face safetensors (and the usual
route from GGUF goes through torch). Here the ``gguf`` package dequantises in
numpy, tensor names are mapped to the Hugging Face / mlx-lm names, and the
tokenizer is rebuilt with ``tokenizers`` from the vocabulary, merges and token
types stored in the GGUF, so the folder is self-contained.

Weights are written to a single ``model.safetensors`` one tensor at a time,
so peak memory is about one dequantised tensor rather than the whole model.

Supported: architectures ``qwen2`` and ``llama``, tokenizer model ``gpt2``
(byte-level BPE). llama.cpp stores llama's Q/K projections permuted for its
interleaved rotary embedding; they are permuted back here. qwen2 uses the
NeoX layout in llama.cpp and is stored unpermuted.
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
from gguf import GGUFReader, TokenType
from gguf.quants import dequantize
from tqdm import tqdm  # type: ignore[import-untyped, unused-ignore]

log = logging.getLogger(__name__)

SUPPORTED_ARCHITECTURES = ("qwen2", "llama")
DTYPES = {"float32": ("F32", "<f4"), "float16": ("F16", "<f2"), "bfloat16": ("BF16", "<u2")}

_LAYER_MAP = {
    "attn_norm": "input_layernorm",
    "ffn_norm": "post_attention_layernorm",
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}
_GLOBAL_MAP = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output_norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
}
# Precomputed rotary frequencies; mlx-lm derives them from the config instead.
_SKIPPED = {"rope_freqs.weight"}
_LAYER_RE = re.compile(r"^blk\.(\d+)\.([a-z_]+)\.(weight|bias)$")

# Pre-tokenizer split patterns, as in the models' Hugging Face tokenizer.json.
_QWEN2_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_LLAMA3_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
# Token strings that end a chat turn in common templates; added to the stop list.
_END_OF_TURN = ("<|im_end|>", "<|endoftext|>", "<|eot_id|>", "<|end_of_text|>")

Array = npt.NDArray[Any]


def convert_gguf(
    gguf_path: Path, out_dir: Path, dtype: str = "float32", progress: bool = True
) -> None:
    """Write ``config.json``, weights and tokenizer files for ``gguf_path`` into ``out_dir``.

    ``dtype`` is the storage type of the weights: ``float32`` (fastest on
    x86 CPUs, where MLX's half-precision kernels are slow), ``float16`` or
    ``bfloat16``.
    """
    if dtype not in DTYPES:
        raise ValueError(f"dtype must be one of {sorted(DTYPES)}, not {dtype!r}")
    reader = GGUFReader(gguf_path)
    arch = _field(reader, "general.architecture")
    if arch not in SUPPORTED_ARCHITECTURES:
        raise ValueError(
            f"unsupported GGUF architecture {arch!r}; supported: {SUPPORTED_ARCHITECTURES}"
        )
    out_dir.mkdir(parents=True, exist_ok=True)

    tokenizer, tok_info = build_tokenizer(reader)
    config = _model_config(reader, arch, dtype, tok_info)
    plan = list(_tensor_plan(reader, arch, config))
    if "lm_head.weight" not in {name for name, _, _ in plan}:
        config["tie_word_embeddings"] = True

    _write_safetensors(out_dir / "model.safetensors", plan, dtype, progress)
    tokenizer.save(str(out_dir / "tokenizer.json"))
    _write_json(out_dir / "config.json", config)
    _write_json(out_dir / "tokenizer_config.json", _tokenizer_config(reader, tok_info, config))
    _write_json(
        out_dir / "generation_config.json",
        {
            "bos_token_id": config.get("bos_token_id"),
            "eos_token_id": config["eos_token_id"],
            "pad_token_id": tok_info.get("pad_id"),
        },
    )


# --- metadata -------------------------------------------------------------------


def _field(reader: GGUFReader, key: str, default: Any = None) -> Any:
    field = reader.get_field(key)
    if field is None:
        if default is None:
            raise ValueError(f"GGUF metadata lacks {key!r}")
        return default
    return field.contents()


def _opt(reader: GGUFReader, key: str) -> Any:
    field = reader.get_field(key)
    return None if field is None else field.contents()


def _model_config(reader: GGUFReader, arch: str, dtype: str, tok: dict[str, Any]) -> dict[str, Any]:
    heads = int(_field(reader, f"{arch}.attention.head_count"))
    hidden = int(_field(reader, f"{arch}.embedding_length"))
    kv_heads = int(_field(reader, f"{arch}.attention.head_count_kv", heads))
    head_dim = int(_field(reader, f"{arch}.attention.key_length", hidden // heads))
    vocab = int(_field(reader, f"{arch}.vocab_size", len(tok["tokens"])))
    config: dict[str, Any] = {
        "architectures": ["Qwen2ForCausalLM" if arch == "qwen2" else "LlamaForCausalLM"],
        "model_type": arch,
        "hidden_size": hidden,
        "num_hidden_layers": int(_field(reader, f"{arch}.block_count")),
        "intermediate_size": int(_field(reader, f"{arch}.feed_forward_length")),
        "num_attention_heads": heads,
        "num_key_value_heads": kv_heads,
        "head_dim": head_dim,
        "hidden_act": "silu",
        "rms_norm_eps": float(_field(reader, f"{arch}.attention.layer_norm_rms_epsilon")),
        "rope_theta": float(_field(reader, f"{arch}.rope.freq_base", 10000.0)),
        "rope_traditional": False,
        "vocab_size": vocab,
        "max_position_embeddings": int(_field(reader, f"{arch}.context_length")),
        "tie_word_embeddings": False,
        "bos_token_id": tok.get("bos_id"),
        "eos_token_id": tok["eos_ids"],
        "torch_dtype": dtype,
    }
    if arch == "llama":
        config.update(attention_bias=False, mlp_bias=False)
    else:
        config.update(use_sliding_window=False)
    scaling = _opt(reader, f"{arch}.rope.scaling.type")
    if scaling == "linear":
        factor = float(_field(reader, f"{arch}.rope.scaling.factor"))
        config["rope_scaling"] = {"type": "linear", "factor": factor}
    elif scaling not in (None, "none"):
        raise ValueError(f"unsupported rope scaling {scaling!r}")
    return config


# --- weights ----------------------------------------------------------------------

Transform = Callable[[Array], Array]


def _tensor_plan(
    reader: GGUFReader, arch: str, config: dict[str, Any]
) -> Iterator[tuple[str, Any, Transform | None]]:
    """Yield ``(hf_name, reader_tensor, transform)`` for every tensor to write."""
    for tensor in reader.tensors:
        name = tensor.name
        if name in _SKIPPED:
            log.info("Skipping %s (derived from the config by mlx-lm)", name)
            continue
        if name in _GLOBAL_MAP:
            yield _GLOBAL_MAP[name], tensor, None
            continue
        match = _LAYER_RE.match(name)
        if match is None or match.group(2) not in _LAYER_MAP:
            raise ValueError(f"unsupported GGUF tensor {name!r}")
        layer, kind, param = match.groups()
        transform: Transform | None = None
        if arch == "llama" and kind in ("attn_q", "attn_k"):
            key = "num_attention_heads" if kind == "attn_q" else "num_key_value_heads"
            transform = _unpermuter(int(config[key]))
        yield f"model.layers.{layer}.{_LAYER_MAP[kind]}.{param}", tensor, transform


def _unpermuter(n_head: int) -> Transform:
    """Undo llama.cpp's Q/K row interleaving (HF half-split rotary layout)."""

    def unpermute(weight: Array) -> Array:
        rows = weight.shape[0]
        return (
            weight.reshape(n_head, rows // n_head // 2, 2, *weight.shape[1:])
            .swapaxes(1, 2)
            .reshape(weight.shape)
        )

    return unpermute


def _np_shape(tensor: Any) -> tuple[int, ...]:
    # GGUF lists dimensions fastest-first; numpy wants them slowest-first.
    return tuple(int(d) for d in reversed(tensor.shape.tolist()))


def _dequantized(tensor: Any) -> Array:
    values = dequantize(tensor.data, tensor.tensor_type)
    return np.asarray(values, dtype=np.float32).reshape(_np_shape(tensor))


def _encode(values: Array, dtype: str) -> bytes:
    if dtype == "bfloat16":
        bits = np.ascontiguousarray(values, dtype="<f4").view("<u4")
        # Round to nearest even on the 16 dropped mantissa bits.
        rounded = (
            bits + np.uint32(0x7FFF) + ((bits >> np.uint32(16)) & np.uint32(1))
        ) >> np.uint32(16)
        return rounded.astype("<u2").tobytes()
    return np.ascontiguousarray(values, dtype=DTYPES[dtype][1]).tobytes()


def _write_safetensors(
    path: Path,
    plan: list[tuple[str, Any, Transform | None]],
    dtype: str,
    progress: bool,
) -> None:
    """Stream tensors into a safetensors file; the header is known up front from shapes."""
    st_dtype, np_dtype = DTYPES[dtype]
    itemsize = np.dtype(np_dtype).itemsize
    header: dict[str, Any] = {"__metadata__": {"format": "mlx"}}
    offset = 0
    for name, tensor, _ in plan:
        shape = _np_shape(tensor)
        size = int(np.prod(shape, dtype=np.int64)) * itemsize
        header[name] = {
            "dtype": st_dtype,
            "shape": list(shape),
            "data_offsets": [offset, offset + size],
        }
        offset += size
    blob = json.dumps(header, separators=(",", ":")).encode()
    blob += b" " * (-len(blob) % 8)
    with (
        path.open("wb") as out,
        tqdm(total=len(plan), unit="tensor", desc="Converting", disable=not progress) as bar,
    ):
        out.write(len(blob).to_bytes(8, "little"))
        out.write(blob)
        for name, tensor, transform in plan:
            values = _dequantized(tensor)
            if transform is not None:
                values = transform(values)
            data = _encode(values, dtype)
            expected = header[name]["data_offsets"]
            if len(data) != expected[1] - expected[0]:
                raise ValueError(f"size mismatch writing {name}")
            out.write(data)
            bar.update(1)


# --- tokenizer --------------------------------------------------------------------


def build_tokenizer(reader: GGUFReader) -> tuple[Any, dict[str, Any]]:
    """Rebuild a Hugging Face fast tokenizer from the GGUF vocabulary.

    Returns the ``tokenizers.Tokenizer`` and a dict of facts the config files
    need (token list, special ids, stop ids). Control tokens become special
    added tokens and user-defined ones plain added tokens, as llama.cpp's
    converter derived those types from the original tokenizer.
    """
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, processors
    from tokenizers import pre_tokenizers as pre

    kind = _field(reader, "tokenizer.ggml.model")
    if kind != "gpt2":
        raise ValueError(f"unsupported tokenizer model {kind!r} (only byte-level BPE 'gpt2')")
    tokens: list[str] = _field(reader, "tokenizer.ggml.tokens")
    types: list[int] = _field(reader, "tokenizer.ggml.token_type", [TokenType.NORMAL] * len(tokens))
    merges: list[str] = _field(reader, "tokenizer.ggml.merges")
    vocab = {
        tok: i
        for i, (tok, ty) in enumerate(zip(tokens, types, strict=True))
        if ty != TokenType.UNUSED
    }
    pairs = [_merge_pair(m) for m in merges]
    tokenizer = Tokenizer(
        models.BPE(vocab=vocab, merges=pairs, fuse_unk=False, byte_fallback=False)
    )

    pre_name = str(_opt(reader, "tokenizer.ggml.pre") or "default")
    if pre_name in ("qwen2", "llama-bpe", "llama3"):
        split = _QWEN2_SPLIT if pre_name == "qwen2" else _LLAMA3_SPLIT
        tokenizer.pre_tokenizer = pre.Sequence(
            [pre.Split(Regex(split), behavior="isolated", invert=False),
             pre.ByteLevel(add_prefix_space=False, use_regex=False)]
        )  # fmt: skip
        if pre_name == "qwen2":
            tokenizer.normalizer = normalizers.NFC()
    elif pre_name in ("smollm", "starcoder", "refact"):
        tokenizer.pre_tokenizer = pre.Sequence(
            [
                pre.Digits(individual_digits=True),
                pre.ByteLevel(add_prefix_space=False, use_regex=True),
            ]
        )
    else:
        if pre_name not in ("gpt-2", "gpt2", "default"):
            log.warning("Unknown pre-tokenizer %r; using GPT-2's split", pre_name)
        tokenizer.pre_tokenizer = pre.ByteLevel(add_prefix_space=False, use_regex=True)
    tokenizer.decoder = decoders.ByteLevel()

    tokenizer.add_special_tokens(
        [
            AddedToken(t, special=True, normalized=False)
            for t, ty in zip(tokens, types, strict=True)
            if ty == TokenType.CONTROL
        ]
    )
    tokenizer.add_tokens(
        [
            AddedToken(t, special=False, normalized=False)
            for t, ty in zip(tokens, types, strict=True)
            if ty == TokenType.USER_DEFINED
        ]
    )

    bos_id = _opt(reader, "tokenizer.ggml.bos_token_id")
    eos_id = _opt(reader, "tokenizer.ggml.eos_token_id")
    add_bos = bool(_opt(reader, "tokenizer.ggml.add_bos_token") or False)
    byte_level = processors.ByteLevel(trim_offsets=False)
    if add_bos and bos_id is not None:
        bos = tokens[int(bos_id)]
        template = processors.TemplateProcessing(
            single=f"{bos} $A", pair=f"{bos} $A {bos} $B", special_tokens=[(bos, int(bos_id))]
        )
        tokenizer.post_processor = processors.Sequence([byte_level, template])
    else:
        tokenizer.post_processor = byte_level

    eos_ids: list[int] = [] if eos_id is None else [int(eos_id)]
    eot = _opt(reader, "tokenizer.ggml.eot_token_id")
    extra = [int(eot)] if eot is not None else []
    extra += [vocab[t] for t in _END_OF_TURN if t in vocab]
    eos_ids += [i for i in extra if i not in eos_ids]
    info: dict[str, Any] = {
        "tokens": tokens,
        "bos_id": None if bos_id is None else int(bos_id),
        "eos_ids": eos_ids,
        "pad_id": _opt(reader, "tokenizer.ggml.padding_token_id"),
        "unk_id": _opt(reader, "tokenizer.ggml.unknown_token_id"),
        "add_bos": add_bos,
    }
    return tokenizer, info


def _merge_pair(merge: str) -> tuple[str, str]:
    left, sep, right = merge.partition(" ")
    if not sep:
        raise ValueError(f"malformed BPE merge {merge!r}")
    return left, right


def _tokenizer_config(
    reader: GGUFReader, tok: dict[str, Any], config: dict[str, Any]
) -> dict[str, Any]:
    tokens: list[str] = tok["tokens"]

    def name(token_id: Any) -> str | None:
        return None if token_id is None else tokens[int(token_id)]

    result: dict[str, Any] = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "add_bos_token": tok["add_bos"],
        "add_eos_token": False,
        "bos_token": name(tok["bos_id"]),
        "eos_token": name(tok["eos_ids"][0] if tok["eos_ids"] else None),
        "pad_token": name(tok["pad_id"]),
        "unk_token": name(tok["unk_id"]),
        "clean_up_tokenization_spaces": False,
        "model_max_length": config["max_position_embeddings"],
        "split_special_tokens": False,
    }
    template = _opt(reader, "tokenizer.chat_template")
    if template:
        result["chat_template"] = template
    return result


def _write_json(path: Path, data: dict[str, Any]) -> None:
    path.write_text(json.dumps(data, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
