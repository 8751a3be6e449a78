"""Loading a local MLX model folder as the engine the model actor drives.

Import this module only on the model thread, after `load_fast_blas()`.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
from pathlib import Path
from typing import Any

from mlxcel.generation import ModelInfo
from mlxcel.model.control_tokens import ControlMask, control_token_ids
from mlxcel.model.engine import LoadedModel
from mlxcel.model.folder import context_length
from mlxcel.model.grammar.constrained import GrammarCompiler
from mlxcel.model.native.blas import BlasInfo
from mlxcel.model.prompt import TemplateCodec
from mlxcel.model.step_plan import StepBudget
from mlxcel.respond.tool_parsers import detect_parser

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # weights are local; never reach for a hub

import mlx.core as mx
from mlx_lm.models.cache import KVCache, make_prompt_cache
from mlx_lm.utils import load

from mlxcel.model import flat_forward, forward
from mlxcel.model.cache.disk import PromptDisk
from mlxcel.model.cache.layout import NAMES, Identity, Layout
from mlxcel.model.cache.prefix import PrefixCache
from mlxcel.model.cache.spill_file import digest
from mlxcel.model.mlx_engine import MlxEngine
from mlxcel.model.native.cpu_forms import fast_log_softmax, install_cpu_forms
from mlxcel.model.native.fused_layer import choose as choose_fused
from mlxcel.model.native.qmm import install_quantized_forms
from mlxcel.model.sampling import Sampler, reference_log_softmax

log = logging.getLogger(__name__)


def load_mlx_model(
    path: Path,
    *,
    name: str,
    max_batch: int,
    prefill_step_size: int,
    blas: BlasInfo,
    prompt_cache_bytes: int,
    ctx_size: int | None = None,
    max_step_ms: float = 0.0,
    prompt_cache_dir: Path | None = None,
    prompt_cache_disk_bytes: int = 0,
) -> LoadedModel:
    """Load a local MLX model folder and wrap it as an engine (on the model thread).

    `prefill_step_size` caps the prompt tokens one step reads (all prompts together);
    `max_step_ms` is the step length the prefill budget aims at (0: 1.5 times the
    decode step of a full batch of `max_batch` rows). `prompt_cache_bytes` bounds the KV states
    kept for reuse plus those of the live sequences (as `mlx_lm.server
    --prompt-cache-bytes` does); 0 disables the cache. With a `prompt_cache_dir`, its
    entries spill to files there, within `prompt_cache_disk_bytes` (`model/cache/disk.py`)."""
    model, tokenizer = load(str(path))[:2]
    fast = install_cpu_forms(model)  # on the CPU device only; Apple GPUs keep MLX's kernels
    quantized = install_quantized_forms(model)  # likewise
    flat = flat_forward.supports(model)
    fused = choose_fused(model, flat)  # logs which layer runs
    grammars = GrammarCompiler.for_hf_tokenizer(tokenizer._tokenizer)
    disk = None
    if prompt_cache_dir is not None and prompt_cache_bytes > 0 and prompt_cache_disk_bytes > 0:
        template = getattr(tokenizer, "chat_template", None) or ""
        disk = _prompt_disk(model, template, path, prompt_cache_dir, prompt_cache_disk_bytes)
    engine = MlxEngine(
        model,
        tokenizer,
        StepBudget(cap=prefill_step_size, full_batch=max_batch, max_step_ms=max_step_ms),
        grammars,
        None,
        PrefixCache(prompt_cache_bytes, disk=disk) if prompt_cache_bytes > 0 else None,
        Sampler(fast_log_softmax if fast else reference_log_softmax),
        flat,
        fused,
        ControlMask(control_token_ids(tokenizer._tokenizer, tokenizer.eos_token_ids)),
        _stop=frozenset(tokenizer.eos_token_ids),
    )
    version = getattr(mx, "__version__", "?")
    forms = ", CPU forms of exp-heavy ops" if fast else ""
    forms += f", CPU quantized matmul ({quantized} modules)" if quantized else ""
    forms += ", one forward per step" if engine.flat else ""
    forms += ", fused layers" if fused is not None else ""
    backend = f"mlx {version} on {mx.default_device()}, BLAS: {blas.name}{forms}"
    model_type = json.loads((path / "config.json").read_text()).get("model_type")
    info = ModelInfo(
        name=name,
        path=str(path),
        context_length=ctx_size or context_length(path),
        backend=backend,
        tool_parser=detect_parser(getattr(tokenizer, "chat_template", None), model_type),
        vocab_size=len(tokenizer._tokenizer),
    )
    codec = TemplateCodec(tokenizer, grammars)
    return LoadedModel(engine, codec, info, None if disk is None else disk.stats)


def _prompt_disk(
    model: Any, template: str, folder: Path, root: Path, max_bytes: int
) -> PromptDisk | None:
    """The disk tier of the model loaded from `folder` (None, logged, for a model whose
    KV state is not plain keys and values). Its layout is read off a one-token forward."""
    probe: list[Any] = make_prompt_cache(model)
    forward.read_chunk(model, [[0]], [probe], [False])
    if not probe or not all(
        type(c) is KVCache and getattr(c.keys, "dtype", None) in NAMES for c in probe
    ):
        log.warning("prompt cache: %s keeps no plain KV state; no disk tier", folder.name)
        return None
    keys, values = probe[0].keys, probe[0].values
    name = NAMES[keys.dtype]
    layout = Layout(len(probe), keys.shape[1], keys.shape[3], values.shape[3], name)
    config = hashlib.sha256((folder / "config.json").read_bytes()).hexdigest()
    identity = Identity(f"{folder.resolve()}#{config}", digest(template))
    try:
        return PromptDisk(root, identity, layout, max_bytes)
    except OSError as exc:  # the folder went away or read-only since the start-time check
        log.warning("prompt cache: %s: %s; prompt caches stay in memory only", root, exc)
        return None
