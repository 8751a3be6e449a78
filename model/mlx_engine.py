"""The MLX engine: continuous batching over mlx-lm's `BatchGenerator`.

Each `step` runs one batched decode step for every active sequence, then one prefill
chunk (`prefill_step_size` tokens) for sequences still reading their prompt, so a long
prompt is interleaved with decoding instead of freezing it. Import this module only on
the model thread, after `load_fast_blas()`.
"""

from __future__ import annotations

import json
import logging
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mlxcel.items import TokenLogprob
from mlxcel.model.blas import BlasInfo
from mlxcel.model.constrained import GrammarCompiler
from mlxcel.model.engine import LoadedModel, ModelInfo, Sampling, SequenceSpec, TokenStep
from mlxcel.model.prompt import TemplateCodec
from mlxcel.model.tool_parsers import detect_parser

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # weights are local; never reach for a hub

import mlx.core as mx
from mlx_lm.generate import BatchGenerator
from mlx_lm.sample_utils import make_sampler
from mlx_lm.utils import load

log = logging.getLogger(__name__)

Sampler = Any  # mlx-lm's `Callable[[mx.array], mx.array]`


@dataclass
class _Live:
    seq_id: int
    detokenizer: Any
    sampling: Sampling


@dataclass
class MlxEngine:
    generator: BatchGenerator
    tokenizer: Any
    grammars: GrammarCompiler | None = None
    _by_uid: dict[int, _Live] = field(default_factory=dict)
    _uid_of: dict[int, int] = field(default_factory=dict)
    _samplers: dict[tuple[float, float], Sampler] = field(default_factory=dict)

    def insert(self, spec: SequenceSpec) -> None:
        sampling = spec.sampling
        if sampling.seed is not None:
            mx.random.seed(sampling.seed)
        processors: list[Any] = []
        if sampling.grammar is not None and self.grammars is not None:
            processors.append(self.grammars.processor(sampling.grammar))
        (uid,) = self.generator.insert(
            [list(spec.prompt)],
            max_tokens=[sampling.max_tokens],
            samplers=[self._sampler(sampling.temperature, sampling.top_p)],
            logits_processors=[processors],
        )
        self._by_uid[uid] = _Live(spec.seq_id, self.tokenizer.detokenizer, sampling)
        self._uid_of[spec.seq_id] = uid

    def _sampler(self, temperature: float, top_p: float) -> Sampler:
        # Sequences with equal settings share one sampler object, so the generator
        # samples the whole batch in one call instead of row by row.
        key = (temperature, top_p if top_p < 1.0 else 0.0)
        if key not in self._samplers:
            self._samplers[key] = make_sampler(temp=key[0], top_p=key[1])
        return self._samplers[key]

    def step(self) -> list[TokenStep]:
        _, generated = self.generator.next()
        steps: list[TokenStep] = []
        for response in generated:
            live = self._by_uid.get(response.uid)
            if live is None:
                continue
            detok = live.detokenizer
            finish = response.finish_reason
            if finish != "stop":  # the stop token itself is not text
                detok.add_token(response.token)
            if finish is not None:
                detok.finalize()
                del self._by_uid[response.uid]
                del self._uid_of[live.seq_id]
            text = detok.last_segment
            logprob = self._logprob(response, live.sampling) if finish != "stop" else None
            steps.append(TokenStep(live.seq_id, response.token, text, finish, logprob))
        return steps

    def _logprob(self, response: Any, sampling: Sampling) -> TokenLogprob | None:
        """The token's log-probability and top alternatives, for sequences that asked."""
        if not sampling.logprobs:
            return None
        vector = response.logprobs
        top: tuple[tuple[str, float], ...] = ()
        if sampling.top_logprobs:
            k = sampling.top_logprobs
            ids = mx.argpartition(-vector, kth=k - 1)[:k]
            id_list: list[int] = ids.tolist()  # type: ignore[assignment]
            values: list[float] = vector[ids].tolist()
            pairs = sorted(zip(id_list, values, strict=True), key=lambda p: -p[1])
            top = tuple((self.tokenizer.decode([i]), float(v)) for i, v in pairs)
        token = self.tokenizer.decode([response.token])
        return TokenLogprob(token, float(vector[response.token].item()), top)

    def remove(self, seq_id: int) -> None:
        uid = self._uid_of.pop(seq_id, None)
        if uid is not None:
            self._by_uid.pop(uid, None)
            self.generator.remove([uid])

    def has_work(self) -> bool:
        return bool(self._by_uid)

    def idle(self) -> None:
        # MLX keeps freed buffers for reuse; after a burst that is the KV caches of a
        # whole batch. Return them when there is nothing to do.
        mx.clear_cache()

    def close(self) -> None:
        for seq_id in list(self._uid_of):
            self.remove(seq_id)
        self.generator.close()


def context_length(path: Path) -> int:
    config = json.loads((path / "config.json").read_text())
    return int(config.get("max_position_embeddings") or 32768)


def load_mlx_model(
    path: Path,
    *,
    name: str,
    max_batch: int,
    prefill_step_size: int,
    blas: BlasInfo,
    ctx_size: int | None = None,
) -> LoadedModel:
    """Load a local MLX model folder and wrap it as an engine (on the model thread)."""
    model, tokenizer = load(str(path))[:2]
    generator = BatchGenerator(
        model,
        stop_tokens=[[t] for t in sorted(tokenizer.eos_token_ids)],
        completion_batch_size=max_batch,
        prefill_batch_size=min(max_batch, 8),
        prefill_step_size=prefill_step_size,
    )
    grammars = GrammarCompiler.for_hf_tokenizer(tokenizer._tokenizer)
    engine = MlxEngine(generator, tokenizer, grammars)
    version = getattr(mx, "__version__", "?")
    backend = f"mlx {version} on {mx.default_device()}, BLAS: {blas.name}"
    model_type = json.loads((path / "config.json").read_text()).get("model_type")
    info = ModelInfo(
        name=name,
        path=str(path),
        context_length=ctx_size or context_length(path),
        backend=backend,
        tool_parser=detect_parser(getattr(tokenizer, "chat_template", None), model_type),
    )
    return LoadedModel(engine=engine, codec=TemplateCodec(tokenizer, grammars), info=info)
