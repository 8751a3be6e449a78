"""The tiny test model: random weights, the default model's real tokenizer.

Built once into the user cache (beside the default model, which lends it its
tokenizer files) by the same atomic, marker-guarded path as a fetched model.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

from mlxcel.model.provision.fetch import build_once, ensure_default_model, is_ready, models_dir


def ensure_tiny_model(out_dir: Path | None = None) -> Path:
    """A tiny random-weight qwen2 model with the default model's real tokenizer.

    For fast tests of the MLX engine path: it loads with ``mlx_lm.load`` and
    generates (meaningless) tokens in milliseconds, while prompts, chat
    template and special tokens behave exactly as with the real model.
    Weights are seeded, so greedy output is deterministic. Needs the default
    model's tokenizer files, so the default model is fetched first if absent.
    """
    target = out_dir if out_dir is not None else models_dir() / "tiny-qwen2-random"
    if is_ready(target):
        return target
    source = ensure_default_model(progress=False)

    def build(out: Path, scratch: Path) -> dict[str, Any]:
        _build_tiny_model(source, out)
        return {"name": "tiny-qwen2-random", "tokenizer_from": source.name}

    return build_once(target, build)


#: Tiny model dimensions: big enough to exercise GQA, biases and several layers.
_TINY = {
    "hidden_size": 64,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "intermediate_size": 128,
}


def _build_tiny_model(source: Path, out: Path) -> None:
    import numpy as np

    from mlxcel.model.provision.gguf_convert import write_json, write_safetensors

    out.mkdir()
    base = json.loads((source / "config.json").read_text(encoding="utf-8"))
    hidden, inter = _TINY["hidden_size"], _TINY["intermediate_size"]
    head_dim = hidden // _TINY["num_attention_heads"]
    kv = _TINY["num_key_value_heads"] * head_dim
    config = {
        **{k: base[k] for k in ("architectures", "model_type", "hidden_act", "rms_norm_eps")},
        **{k: base[k] for k in ("rope_theta", "vocab_size", "max_position_embeddings")},
        **_TINY,
        "head_dim": head_dim,
        # An untied random head makes greedy output vary from token to token;
        # tied to a random embedding it would echo the last prompt token.
        "tie_word_embeddings": False,
        "use_sliding_window": False,
        "bos_token_id": base.get("bos_token_id"),
        "eos_token_id": base["eos_token_id"],
        "torch_dtype": "float32",
    }
    shapes: dict[str, tuple[int, ...]] = {"model.embed_tokens.weight": (base["vocab_size"], hidden)}
    for i in range(_TINY["num_hidden_layers"]):
        layer = f"model.layers.{i}"
        shapes |= {
            f"{layer}.input_layernorm.weight": (hidden,),
            f"{layer}.post_attention_layernorm.weight": (hidden,),
            f"{layer}.self_attn.q_proj.weight": (hidden, hidden),
            f"{layer}.self_attn.q_proj.bias": (hidden,),
            f"{layer}.self_attn.k_proj.weight": (kv, hidden),
            f"{layer}.self_attn.k_proj.bias": (kv,),
            f"{layer}.self_attn.v_proj.weight": (kv, hidden),
            f"{layer}.self_attn.v_proj.bias": (kv,),
            f"{layer}.self_attn.o_proj.weight": (hidden, hidden),
            f"{layer}.mlp.gate_proj.weight": (inter, hidden),
            f"{layer}.mlp.up_proj.weight": (inter, hidden),
            f"{layer}.mlp.down_proj.weight": (hidden, inter),
        }
    shapes["model.norm.weight"] = (hidden,)
    shapes["lm_head.weight"] = (base["vocab_size"], hidden)
    rng = np.random.default_rng(20240601)
    arrays = {
        name: np.ones(shape, np.float32)
        if name.endswith("norm.weight")
        else rng.normal(0.0, 0.02 if len(shape) > 1 else 0.01, shape).astype(np.float32)
        for name, shape in shapes.items()
    }
    entries = [(name, a.shape, lambda a=a: a) for name, a in arrays.items()]
    write_safetensors(out / "model.safetensors", entries)
    write_json(out / "config.json", config)
    for name in ("tokenizer.json", "tokenizer_config.json", "generation_config.json"):
        if (source / name).is_file():
            shutil.copyfile(source / name, out / name)


def load_tiny(path: Path, *, max_batch: int = 4, prefill_step_size: int = 64) -> Any:
    """The tiny model loaded as the server loads a model (a `LoadedModel`), with the
    default prompt cache; call after `load_fast_blas()`."""
    from mlxcel.config import Settings
    from mlxcel.model.mlx_load import load_mlx_model
    from mlxcel.model.native.blas import load_fast_blas

    return load_mlx_model(
        path,
        name="tiny",
        max_batch=max_batch,
        prefill_step_size=prefill_step_size,
        blas=load_fast_blas(),
        prompt_cache_bytes=Settings().prompt_cache_bytes,
    )
