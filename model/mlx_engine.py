"""The MLX engine: continuous batching over mlx-lm's `BatchGenerator`.

Each `step` runs one batched decode step for every active sequence, then one prefill
chunk (`prefill_step_size` tokens) for sequences still reading their prompt, so a long
prompt is interleaved with decoding instead of freezing it. Import this module only on
the model thread, after `load_fast_blas()`.

With a prefix cache, a new sequence starts from a copy of the KV state of the longest
cached prefix of its prompt and prefills only the rest. KV states are kept when a
prompt is read (all but its last token, which is fed with the first decode step), when
a sequence finishes (prompt and generated tokens, so a follow-up turn that resends the
history reuses both) and when a sequence is removed midway (what it had computed).
"""

from __future__ import annotations

import json
import logging
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mlxcel.generation import ModelInfo, PrefillProgress, Sampling, SequenceSpec, TokenStep
from mlxcel.items import TokenLogprob
from mlxcel.model.constrained import GrammarCompiler
from mlxcel.model.engine import LoadedModel
from mlxcel.model.folder import context_length
from mlxcel.model.prompt import TemplateCodec
from mlxcel.model.provision.blas import BlasInfo
from mlxcel.model.tool_parsers import detect_parser

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # weights are local; never reach for a hub

import mlx.core as mx
from mlx_lm.generate import BatchGenerator
from mlx_lm.sample_utils import make_sampler
from mlx_lm.utils import load

from mlxcel.model.prefix_cache import CacheKind, PrefixCache

log = logging.getLogger(__name__)

Sampler = Any  # mlx-lm's `Callable[[mx.array], mx.array]`


@dataclass
class _Live:
    seq_id: int
    detokenizer: Any
    sampling: Sampling
    cached: int = 0
    """Prompt tokens taken from the prefix cache."""
    written: int = 0
    """Prompt tokens prefilled now and kept by the prefix cache."""
    started: bool = False
    """The first token was reported."""
    read: tuple[int, int] | None = None
    """Prompt tokens read and their total while the prompt is being read (cache included)."""


@dataclass
class MlxEngine:
    generator: BatchGenerator
    tokenizer: Any
    grammars: GrammarCompiler | None = None
    prefix_cache: PrefixCache | None = None
    _by_uid: dict[int, _Live] = field(default_factory=dict)
    _uid_of: dict[int, int] = field(default_factory=dict)
    _samplers: dict[tuple[float, float], Sampler] = field(default_factory=dict)
    _suspect: bool = False
    """A step failed: the generator's KV states may not match their tokens, so none are
    kept until every sequence in it is gone."""

    def insert(self, spec: SequenceSpec) -> None:
        sampling = spec.sampling
        if sampling.seed is not None:
            mx.random.seed(sampling.seed)
        processors: list[Any] = []
        if sampling.grammar is not None and self.grammars is not None:
            processors.append(self.grammars.processor(sampling.grammar))
        prompt = list(spec.prompt)
        cache, cached = None, 0
        if self.prefix_cache is not None:
            cache, cached = self.prefix_cache.fetch(prompt)
            if cached:
                log.debug("prefix cache hit: %d of %d prompt tokens", cached, len(prompt))
        (uid,) = self.generator.insert(
            [prompt[cached:]],
            max_tokens=[sampling.max_tokens],
            caches=None if cache is None else [cache],
            all_tokens=[prompt[:cached]],  # the generator extends this list in place
            samplers=[self._sampler(sampling.temperature, sampling.top_p)],
            logits_processors=[processors],
        )
        del cache  # the generator owns it now
        written = len(prompt) - cached if self.prefix_cache is not None else 0
        detokenizer = self.tokenizer.detokenizer
        self._by_uid[uid] = _Live(spec.seq_id, detokenizer, sampling, cached, written)
        self._uid_of[spec.seq_id] = uid
        if self.prefix_cache is not None:  # live sequences count against the budget too
            self.prefix_cache.fit(self.generator.prompt_cache_nbytes)

    def _sampler(self, temperature: float, top_p: float) -> Sampler:
        # Sequences with equal settings share one sampler object, so the generator
        # samples the whole batch in one call instead of row by row.
        key = (temperature, top_p if top_p < 1.0 else 0.0)
        if key not in self._samplers:
            self._samplers[key] = make_sampler(temp=key[0], top_p=key[1])
        return self._samplers[key]

    def step(self) -> list[TokenStep]:
        self._suspect = True
        prompts, generated = self.generator.next()
        self._suspect = False
        if self.prefix_cache is not None:
            self._keep_read_prompts(prompts)
        self._note_progress(prompts)
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
                self._keep(response.all_tokens, response.prompt_cache, "assistant")
            text = detok.last_segment
            logprob = self._logprob(response, live.sampling) if finish != "stop" else None
            cached, written = (0, 0) if live.started else (live.cached, live.written)
            live.started = True
            steps.append(
                TokenStep(live.seq_id, response.token, text, finish, logprob, cached, written)
            )
        return steps

    def _note_progress(self, prompts: list[Any]) -> None:
        for response in prompts:
            live = self._by_uid.get(response.uid)
            if live is not None and isinstance(response.progress, tuple):
                done, total = response.progress  # of the part not taken from the cache
                live.read = (live.cached + done, live.cached + total)

    def prefilling(self) -> list[PrefillProgress]:
        return [
            PrefillProgress(live.seq_id, *live.read)
            for live in self._by_uid.values()
            if live.read is not None and not live.started and live.read[0] < live.read[1]
        ]

    def _keep_read_prompts(self, prompts: list[Any]) -> None:
        """Keep the KV state of prompts whose reading just ended (all but the last token,
        which the first decode step feeds), for requests that share them."""
        uids = [
            r.uid
            for r in prompts
            if r.end_of_segment and not r.end_of_prompt and r.uid in self._by_uid
        ]
        if uids:
            for cache, tokens in self.generator.extract_cache(uids).values():
                self._keep(tokens, cache, "user")

    def _keep(self, tokens: list[int] | None, cache: list[Any] | None, kind: CacheKind) -> None:
        if self.prefix_cache is not None and tokens and cache is not None:
            self.prefix_cache.store(tokens, cache, kind)

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
        if uid is None:
            return
        live = self._by_uid.pop(uid)
        keep = self.prefix_cache is not None and not self._suspect
        caches = self.generator.remove([uid], return_prompt_caches=keep)
        for cache, tokens in caches.values():
            if len(tokens) > live.cached:  # it computed something beyond its cached copy
                self._keep(tokens, cache, "assistant" if live.started else "user")
        if not self._by_uid:
            self._suspect = False

    def has_work(self) -> bool:
        return bool(self._by_uid)

    def idle(self) -> None:
        # MLX keeps freed buffers for reuse; after a burst that is the KV caches of a
        # whole batch. Return them when there is nothing to do (the prefix cache's
        # arrays are in use, so they stay).
        mx.clear_cache()

    def close(self) -> None:
        self.prefix_cache = None
        for seq_id in list(self._uid_of):
            self.remove(seq_id)
        self.generator.close()


def load_mlx_model(
    path: Path,
    *,
    name: str,
    max_batch: int,
    prefill_step_size: int,
    blas: BlasInfo,
    prompt_cache_bytes: int,
    ctx_size: int | None = None,
) -> LoadedModel:
    """Load a local MLX model folder and wrap it as an engine (on the model thread).

    `prompt_cache_bytes` (the server's `--prompt-cache-bytes`) bounds the KV states kept for reuse plus those of the live
    sequences (as `mlx_lm.server --prompt-cache-bytes` does); 0 disables the cache."""
    model, tokenizer = load(str(path))[:2]
    generator = BatchGenerator(
        model,
        stop_tokens=[[t] for t in sorted(tokenizer.eos_token_ids)],
        completion_batch_size=max_batch,
        prefill_batch_size=min(max_batch, 8),
        prefill_step_size=prefill_step_size,
    )
    grammars = GrammarCompiler.for_hf_tokenizer(tokenizer._tokenizer)
    prefix_cache = PrefixCache(prompt_cache_bytes) if prompt_cache_bytes > 0 else None
    engine = MlxEngine(generator, tokenizer, grammars, prefix_cache)
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
