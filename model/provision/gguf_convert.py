"""Convert a llama.cpp GGUF file into an MLX model folder that ``mlx_lm.load`` reads.

Why not ``mlx_lm.convert``: it wants Hugging Face safetensors (and the usual
route from GGUF goes through torch). Here the ``gguf`` package dequantises in
numpy, tensor names are mapped to the Hugging Face / mlx-lm names, and the
tokenizer is rebuilt from the vocabulary stored in the GGUF
(:mod:`mlxcel.model.provision.gguf_tokenizer`), so the folder is self-contained.

Two precisions: ``keep_quantized`` writes an mlx-lm quantised folder in which
every block-quantised matrix keeps the file's own precision, re-packed into
MLX's affine groups of 32 (:mod:`mlxcel.model.provision.gguf_quant`), with
the ``quantization`` blocks in ``config.json`` that make ``mlx_lm.load``
build the matching ``QuantizedLinear`` / ``QuantizedEmbedding`` per module;
float tensors stay float. Without it every tensor is dequantised to float
(about four times the disk and memory, but MLX's CPU float matmul is fast).

Weights are streamed into a single ``model.safetensors`` one tensor at a
time, so peak memory is about one (dequantised) tensor, not the whole model.

Supported: architectures ``qwen2`` and ``llama`` with a byte-level BPE
tokenizer. llama.cpp stores llama's Q/K projections with rows interleaved
for its rotary embedding; they are permuted back to the Hugging Face layout
here. qwen2 uses the NeoX rotary layout in llama.cpp and is stored as is.
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
from gguf import GGMLQuantizationType, GGUFReader, ReaderTensor
from gguf.quants import dequantize
from tqdm import tqdm  # type: ignore[import-untyped, unused-ignore]

from mlxcel.model.provision.gguf_quant import (
    GROUP_SIZE,
    Report,
    mlx_bits,
    quantization_config,
    quantized_producer,
)
from mlxcel.model.provision.gguf_tokenizer import (
    TokenizerFacts,
    build_tokenizer,
    field,
    tokenizer_config,
)

log = logging.getLogger(__name__)

SUPPORTED_ARCHITECTURES = ("qwen2", "llama")
#: Output dtype -> (safetensors dtype tag, numpy storage dtype).
DTYPES = {"float32": ("F32", "<f4"), "float16": ("F16", "<f2"), "bfloat16": ("BF16", "<u2")}
#: Safetensors dtype tag -> numpy storage dtype (U32: MLX's packed quantised weights).
_STORAGE = {"F32": "<f4", "F16": "<f2", "BF16": "<u2", "U32": "<u4"}
_FLOAT_TYPES = (GGMLQuantizationType.F32, GGMLQuantizationType.F16, GGMLQuantizationType.BF16)

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
# Relative difference below which output.weight and token_embd.weight are
# two quantisations of one tied matrix (Q5_0 vs Q8_0 differ by ~4%; distinct
# matrices differ by ~140%).
_TIED_TOLERANCE = 0.15

Array = npt.NDArray[Any]
Transform = Callable[[Array], Array]
Plan = list[tuple[str, ReaderTensor, Transform | None]]
#: ``(name, shape, produce)``: a tensor to write and how to compute it when its turn comes.
Entry = tuple[str, tuple[int, ...], Callable[[], Array]]
#: ``(name, safetensors dtype tag, shape)`` of one stored tensor.
Spec = tuple[str, str, tuple[int, ...]]
#: Tensors computed together (a quantised weight with its scales and biases) and how.
Group = tuple[tuple[Spec, ...], Callable[[], Sequence[Array]]]


def convert_gguf(
    gguf_path: Path,
    out_dir: Path,
    dtype: str = "float32",
    progress: bool = True,
    *,
    keep_quantized: bool = False,
) -> None:
    """Write weights, ``config.json`` and tokenizer files for ``gguf_path`` into ``out_dir``.

    ``dtype`` is the storage type of float weights: ``float32`` (fastest on
    x86 CPUs, where MLX's half-precision kernels are slow), ``float16`` or
    ``bfloat16``. ``keep_quantized`` keeps block-quantised matrices quantised
    (MLX affine, group 32) instead of dequantising them to ``dtype``.
    """
    if dtype not in DTYPES:
        raise ValueError(f"dtype must be one of {sorted(DTYPES)}, not {dtype!r}")
    reader = GGUFReader(gguf_path)
    arch = field(reader, "general.architecture")
    if arch not in SUPPORTED_ARCHITECTURES:
        raise ValueError(
            f"unsupported GGUF architecture {arch!r}; supported: {SUPPORTED_ARCHITECTURES}"
        )
    tokenizer, facts = build_tokenizer(reader)
    config = model_config(reader, arch, dtype, facts)
    plan = _tensor_plan(reader, arch, config)
    config["tie_word_embeddings"] = all(name != "lm_head.weight" for name, _, _ in plan)

    report: Report = []
    groups, bits = _tensor_groups(plan, dtype, keep_quantized, report)
    if bits:
        config["quantization"] = quantization_config(bits)
        config["quantization_config"] = quantization_config(bits)

    out_dir.mkdir(parents=True, exist_ok=True)
    write_groups(out_dir / "model.safetensors", groups, progress)
    if report:
        name, qtype, error, largest = max(report, key=lambda r: r[2] / max(r[3], 1e-30))
        log.info(
            "%d tensors re-quantised to 8 bits; largest error %.3g in %s (%s, largest weight %.3g)",
            len(report), error, name, qtype, largest,
        )  # fmt: skip
    tokenizer.save(str(out_dir / "tokenizer.json"))
    write_json(out_dir / "config.json", config)
    max_length = int(config["max_position_embeddings"])
    write_json(out_dir / "tokenizer_config.json", tokenizer_config(facts, max_length))
    generation = {
        "bos_token_id": facts.bos_id,
        "eos_token_id": facts.eos_ids,
        "pad_token_id": facts.pad_id,
    }
    write_json(out_dir / "generation_config.json", generation)


def model_config(
    reader: GGUFReader, arch: str, dtype: str, facts: TokenizerFacts
) -> dict[str, Any]:
    """Hugging Face style ``config.json`` contents from the GGUF hyperparameters."""
    heads = int(field(reader, f"{arch}.attention.head_count"))
    hidden = int(field(reader, f"{arch}.embedding_length"))
    config: dict[str, Any] = {
        "architectures": ["Qwen2ForCausalLM" if arch == "qwen2" else "LlamaForCausalLM"],
        "model_type": arch,
        "hidden_size": hidden,
        "num_hidden_layers": int(field(reader, f"{arch}.block_count")),
        "intermediate_size": int(field(reader, f"{arch}.feed_forward_length")),
        "num_attention_heads": heads,
        "num_key_value_heads": int(field(reader, f"{arch}.attention.head_count_kv", heads)),
        "head_dim": int(field(reader, f"{arch}.attention.key_length", hidden // heads)),
        "hidden_act": "silu",
        "rms_norm_eps": float(field(reader, f"{arch}.attention.layer_norm_rms_epsilon")),
        "rope_theta": float(field(reader, f"{arch}.rope.freq_base", 10000.0)),
        "vocab_size": int(field(reader, f"{arch}.vocab_size", len(facts.tokens))),
        "max_position_embeddings": int(field(reader, f"{arch}.context_length")),
        "tie_word_embeddings": False,
        "bos_token_id": facts.bos_id,
        "eos_token_id": facts.eos_ids,
        "torch_dtype": dtype,
    }
    if arch == "llama":
        config.update(attention_bias=False, mlp_bias=False)
    else:
        config.update(use_sliding_window=False)
    scaling = field(reader, f"{arch}.rope.scaling.type", None)
    if scaling == "linear":
        factor = float(field(reader, f"{arch}.rope.scaling.factor"))
        config["rope_scaling"] = {"type": "linear", "factor": factor}
    elif scaling not in (None, "none"):
        raise ValueError(f"unsupported rope scaling {scaling!r}")
    return config


# --- tensors ----------------------------------------------------------------------


def _tensor_plan(reader: GGUFReader, arch: str, config: dict[str, Any]) -> Plan:
    """``(hf_name, tensor, transform)`` for every tensor to write, in file order."""
    by_name = {t.name: t for t in reader.tensors}
    tied = _tied_embedding(by_name.get("token_embd.weight"), by_name.get("output.weight"))
    plan: Plan = []
    for tensor in reader.tensors:
        name = tensor.name
        if name in _SKIPPED or (tied is not None and name == "output.weight"):
            continue
        if name in _GLOBAL_MAP:
            source = tied if tied is not None and name == "token_embd.weight" else tensor
            plan.append((_GLOBAL_MAP[name], source, None))
            continue
        match = _LAYER_RE.match(name)
        if match is None or match.group(2) not in _LAYER_MAP:
            raise ValueError(f"unsupported GGUF tensor {name!r}")
        layer, kind, param = match.groups()
        transform: Transform | None = None
        if arch == "llama" and kind in ("attn_q", "attn_k"):
            key = "num_attention_heads" if kind == "attn_q" else "num_key_value_heads"
            transform = _unpermuter(int(config[key]))
        plan.append((f"model.layers.{layer}.{_LAYER_MAP[kind]}.{param}", tensor, transform))
    return plan


def _tied_embedding(embed: ReaderTensor | None, output: ReaderTensor | None) -> ReaderTensor | None:
    """The tensor to store once when the output head is a copy of the embedding.

    llama.cpp writes ``output.weight`` even for models trained with tied
    embeddings whenever it quantises head and embedding differently (the
    default Qwen2.5 model: Q8_0 head, Q5_0 embedding). Storing both in
    float32 would waste ~0.5 GB of disk and RAM, so when a sample of rows
    shows they are the same matrix up to quantisation noise, the more
    precise copy (more bytes per weight) serves as both.
    """
    if embed is None or output is None:
        return None
    if _np_shape(embed) != _np_shape(output):
        return None
    rows = _np_shape(embed)[0]
    starts = np.linspace(0, max(rows - 256, 0), num=8, dtype=np.int64)
    diff = norm = 0.0
    for start in {int(s) for s in starts}:
        a = dequantize(embed.data[start : start + 256], embed.tensor_type)
        b = dequantize(output.data[start : start + 256], output.tensor_type)
        diff += float(np.sum((a - b) ** 2))
        norm += float(np.sum(b.astype(np.float64) ** 2))
    relative = (diff / norm) ** 0.5 if norm > 0 else float("inf")
    if relative >= _TIED_TOLERANCE:
        return None
    chosen = output if output.n_bytes >= embed.n_bytes else embed
    log.info(
        "output.weight matches token_embd.weight (relative difference %.3f); "
        "storing tied embeddings from %s",
        relative,
        chosen.tensor_type.name,
    )
    return chosen


def _unpermuter(n_head: int) -> Transform:
    """Undo llama.cpp's Q/K row interleaving (back to the half-split rotary layout)."""

    def unpermute(weight: Array) -> Array:
        rows = weight.shape[0]
        return (
            weight.reshape(n_head, rows // n_head // 2, 2, *weight.shape[1:])
            .swapaxes(1, 2)
            .reshape(weight.shape)
        )

    return unpermute


def _np_shape(tensor: ReaderTensor) -> tuple[int, ...]:
    # GGUF lists dimensions fastest-first; numpy wants them slowest-first.
    return tuple(int(d) for d in reversed(tensor.shape.tolist()))


def _tensor_groups(
    plan: Plan, dtype: str, keep_quantized: bool, report: Report
) -> tuple[list[Group], dict[str, int]]:
    """What to write for each planned tensor, and the MLX bits of each quantised module.

    A matrix whose GGUF type has an MLX re-packing becomes ``weight`` (U32),
    ``scales`` and ``biases`` (F32) of its module when ``keep_quantized``;
    everything else is stored as float ``dtype``.
    """
    tag = DTYPES[dtype][0]
    groups: list[Group] = []
    bits: dict[str, int] = {}
    for name, tensor, transform in plan:
        shape = _np_shape(tensor)
        qtype = tensor.tensor_type
        width = mlx_bits(qtype) if keep_quantized and len(shape) == 2 else None
        if width is None:
            if keep_quantized and qtype not in _FLOAT_TYPES:
                log.info("%s: no MLX re-packing for %s; stored as %s", name, qtype.name, dtype)
            groups.append((((name, tag, shape),), _producer(tensor, transform)))
            continue
        module = name.removesuffix(".weight")
        rows, cols = shape
        specs = (
            (name, "U32", (rows, cols * width // 32)),
            (f"{module}.scales", "F32", (rows, cols // GROUP_SIZE)),
            (f"{module}.biases", "F32", (rows, cols // GROUP_SIZE)),
        )
        groups.append((specs, quantized_producer(name, tensor, transform, report)))
        bits[module] = width
    return groups, bits


def _producer(tensor: ReaderTensor, transform: Transform | None) -> Callable[[], list[Array]]:
    def produce() -> list[Array]:
        values = dequantize(tensor.data, tensor.tensor_type)
        values = np.asarray(values, dtype=np.float32).reshape(_np_shape(tensor))
        return [values if transform is None else transform(values)]

    return produce


def _encode(values: Array, tag: str) -> bytes:
    if tag == "BF16":
        bits = np.ascontiguousarray(values, dtype="<f4").view("<u4")
        # Round to nearest even on the 16 dropped mantissa bits.
        lsb = (bits >> np.uint32(16)) & np.uint32(1)
        return ((bits + np.uint32(0x7FFF) + lsb) >> np.uint32(16)).astype("<u2").tobytes()
    return np.ascontiguousarray(values, dtype=_STORAGE[tag]).tobytes()


def write_safetensors(
    path: Path, entries: Sequence[Entry], dtype: str = "float32", progress: bool = False
) -> None:
    """Stream float tensors into a safetensors file, producing each only when it is written."""
    tag = DTYPES[dtype][0]
    groups: list[Group] = [
        (((name, tag, shape),), _one(produce)) for name, shape, produce in entries
    ]
    write_groups(path, groups, progress)


def _one(produce: Callable[[], Array]) -> Callable[[], list[Array]]:
    return lambda: [produce()]


def write_groups(path: Path, groups: Sequence[Group], progress: bool = False) -> None:
    """Stream tensors into a safetensors file, producing each group only when it is written.

    The header needs every shape up front, which the GGUF tensor table (or
    the caller) already knows, so no tensor has to be held in memory
    before its turn.
    """
    header: dict[str, Any] = {"__metadata__": {"format": "mlx"}}
    offset = 0
    for specs, _ in groups:
        for name, tag, shape in specs:
            size = int(np.prod(shape, dtype=np.int64)) * np.dtype(_STORAGE[tag]).itemsize
            header[name] = {
                "dtype": tag,
                "shape": list(shape),
                "data_offsets": [offset, offset + size],
            }
            offset += size
    blob = json.dumps(header, separators=(",", ":")).encode()
    blob += b" " * (-len(blob) % 8)
    bar = tqdm(total=len(groups), unit="tensor", desc="Converting", disable=not progress)
    with path.open("wb") as out, bar:
        out.write(len(blob).to_bytes(8, "little"))
        out.write(blob)
        for specs, produce in groups:
            arrays = produce()
            for (name, tag, shape), values in zip(specs, arrays, strict=True):
                if tuple(values.shape) != tuple(shape):
                    raise ValueError(f"{name}: produced shape {values.shape}, expected {shape}")
                out.write(_encode(values, tag))
            bar.update(1)


def write_json(path: Path, data: dict[str, Any]) -> None:
    """Pretty JSON, UTF-8, as Hugging Face tooling writes its config files."""
    path.write_text(json.dumps(data, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
