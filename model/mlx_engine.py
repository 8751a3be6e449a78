"""The MLX engine: continuous batching with our own step policy over mlx-lm's models.

A step has two phases, and the model actor delivers each one's tokens before the next
runs. `decode` feeds every running row its last token in one forward and samples the
next. `prefill` then reads prompts within the step's budget (`step_plan`): a chunk of
one or several prompts; a prompt whose last token is in the chunk gets its logits
there, its first token is sampled and reported in that same step, and it joins the
decode batch for the next one. So decoding never waits behind more prompt than the
budget allows, and no forward is spent on a first token.

Prompts wait in a FIFO and are admitted to reading a few at a time; the prefix cache is
consulted at admission, not at insert, so a request queued while a shared prefix is
being read finds it. A waiting prompt that shares an uncached prefix (`SHARED_PREFIX`
tokens or more) with one being read waits for that one to finish, then starts from
its KV state. KV states are kept when a prompt is read, when a sequence finishes
(prompt and generated tokens, so a follow-up turn that resends the history reuses
both) and when a sequence is removed midway (what it had computed).

Import this module only on the model thread, after `load_fast_blas()`.
"""

from __future__ import annotations

import json
import logging
import os
import time
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mlxcel.generation import ModelInfo, PrefillProgress, Sampling, SequenceSpec, TokenStep
from mlxcel.model.blas import BlasInfo
from mlxcel.model.constrained import GrammarCompiler, GrammarMasks
from mlxcel.model.engine import LoadedModel
from mlxcel.model.folder import context_length
from mlxcel.model.prompt import TemplateCodec
from mlxcel.model.step_plan import MAX_PREFILL_ROWS, StepBudget, Waiting, plan_chunk
from mlxcel.respond.tool_parsers import detect_parser

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # weights are local; never reach for a hub

import mlx.core as mx
from mlx_lm.models.cache import make_prompt_cache
from mlx_lm.utils import load

from mlxcel.model import forward
from mlxcel.model.cpu_forms import fast_log_softmax, install_cpu_forms
from mlxcel.model.forward import KV
from mlxcel.model.prefix_cache import CacheKind, PrefixCache
from mlxcel.model.qmm import install_quantized_forms
from mlxcel.model.sampling import Rng, Sampler, reference_log_softmax, row_generator, token_logprob

log = logging.getLogger(__name__)

SHARED_PREFIX = 32
"""Uncached prompt tokens two waiting prompts must share for one to wait for the other."""


@dataclass
class _Row:
    """One sequence, from insert to its last token."""

    spec: SequenceSpec
    detokenizer: Any
    matcher: Any | None
    """The grammar's matcher (structured output), fed every token the row samples."""
    cache: KV | None = None
    """Its own KV state while its prompt is read (None before admission)."""
    cached: int = 0
    """Prompt tokens taken from the prefix cache."""
    read: int = 0
    """Prompt tokens in its KV state (cached ones included)."""
    fed: list[int] = field(default_factory=list)
    """Generated tokens in the decode batch's KV state, in order."""
    last: int = 0
    """The token the next decode step feeds."""
    rng: Rng = field(default_factory=row_generator)  # its own: draws independent of the batch

    @property
    def prompt(self) -> tuple[int, ...]:
        return self.spec.prompt

    @property
    def sampling(self) -> Sampling:
        return self.spec.sampling


@dataclass
class MlxEngine:
    model: Any
    tokenizer: Any
    budget: StepBudget
    grammars: GrammarCompiler | None = None
    masks: GrammarMasks | None = None
    prefix_cache: PrefixCache | None = None
    sampler: Sampler = field(default_factory=Sampler)
    _waiting: deque[_Row] = field(default_factory=deque)
    """Inserted, not yet admitted to reading (FIFO)."""
    _reading: dict[int, _Row] = field(default_factory=dict)
    """Admitted, prompt being read, in admission order."""
    _decoding: list[_Row] = field(default_factory=list)
    """Rows of the decode batch, in the batch's order."""
    _batch: KV | None = None
    _stop: frozenset[int] = frozenset()
    _suspect: bool = False
    """A step failed: KV states may not match their tokens, so none are kept until
    every sequence is gone."""

    # --- the engine protocol -------------------------------------------------------

    def insert(self, spec: SequenceSpec) -> None:
        sampling = spec.sampling
        if not spec.prompt:
            raise ValueError("empty prompt")
        matcher = None
        if sampling.grammar is not None and self.grammars is not None:
            matcher = self.grammars.matcher(sampling.grammar)
        rng = row_generator(sampling.seed)
        self._waiting.append(_Row(spec, self.tokenizer.detokenizer, matcher, rng=rng))

    def decode(self) -> list[TokenStep]:
        """One token for every running row."""
        if not self._decoding:
            return []
        started = time.perf_counter()
        self._suspect = True
        rows = self._decoding
        assert self._batch is not None
        logits = forward.decode_logits(self.model, [r.last for r in rows], self._batch)
        tokens, logprobs = self._sample(logits, rows)
        self._suspect = False
        steps: list[TokenStep] = []
        keep: list[int] = []
        for i, (row, token) in enumerate(zip(rows, tokens, strict=True)):
            row.fed.append(row.last)
            step = self._emit(row, token, logprobs.get(i), first=False)
            steps.append(step)
            if step.finish is None:
                keep.append(i)
            else:
                self._keep(row, self._tokens(row), forward.extract(self._batch, i), "assistant")
        self._filter(keep)
        self.budget.observe_decode(len(rows), time.perf_counter() - started)
        return steps

    def prefill(self) -> list[TokenStep]:
        """Read prompts within the step's budget; the first tokens of those that end."""
        self._admit()
        waiting = [Waiting(k, len(r.prompt) - r.read) for k, r in self._reading.items()]
        batch = len(self._decoding) + len(self._reading) + len(self._waiting)
        chunk = plan_chunk(waiting, self.budget.tokens(len(self._decoding), batch))
        if chunk is None:
            return []
        started = time.perf_counter()
        self._suspect = True
        rows = [self._reading[k] for k in chunk.keys]
        parts = [r.prompt[r.read : r.read + n] for r, n in zip(rows, chunk.reads, strict=True)]
        ending = [r.read + n == len(r.prompt) for r, n in zip(rows, chunk.reads, strict=True)]
        caches, logits = forward.read_chunk(
            self.model, parts, [r.cache for r in rows if r.cache is not None], ending
        )
        for row, n, cache in zip(rows, chunk.reads, caches, strict=True):
            row.cache, row.read = cache, row.read + n
        self._suspect = False  # the KV states hold what each row read: safe to keep
        steps: list[TokenStep] = []
        ended = [i for i, e in enumerate(ending) if e]
        if ended:
            firsts = [rows[i] for i in ended]
            tokens, logprobs = self._sample(mx.stack([logits[i] for i in ended]), firsts)
            joining: list[_Row] = []
            for n, (row, token) in enumerate(zip(firsts, tokens, strict=True)):
                del self._reading[row.spec.seq_id]
                step = self._emit(row, token, logprobs.get(n), first=True)
                steps.append(step)
                if step.finish is None:
                    joining.append(row)
                else:
                    self._keep_prompt(row)
            self._join(joining)
        self.budget.observe_prefill(chunk.tokens, time.perf_counter() - started)
        return steps

    def step(self) -> list[TokenStep]:
        """Both phases at once (for callers that need not deliver in between)."""
        return [*self.decode(), *self.prefill()]

    def prefilling(self) -> list[PrefillProgress]:
        return [
            PrefillProgress(r.spec.seq_id, r.read, len(r.prompt))
            for r in self._reading.values()
            if r.read < len(r.prompt)
        ]

    def remove(self, seq_id: int) -> None:
        keep = self.prefix_cache is not None and not self._suspect
        for row in self._waiting:
            if row.spec.seq_id == seq_id:
                self._waiting.remove(row)
                return
        reading = self._reading.pop(seq_id, None)
        if reading is not None:
            if keep and reading.cache is not None and reading.read > reading.cached:
                self._keep(reading, list(reading.prompt[: reading.read]), reading.cache, "user")
            return
        for i, row in enumerate(self._decoding):
            if row.spec.seq_id == seq_id:
                if keep and self._batch is not None:
                    extracted = forward.extract(self._batch, i)
                    self._keep(row, self._tokens(row), extracted, "assistant")
                self._filter([j for j in range(len(self._decoding)) if j != i])
                break
        if not self.has_work():
            self._suspect = False

    def has_work(self) -> bool:
        return bool(self._waiting or self._reading or self._decoding)

    def idle(self) -> None:
        # MLX keeps freed buffers for reuse; after a burst that is the KV caches of a
        # whole batch. Return them when there is nothing to do (the prefix cache's
        # arrays are in use, so they stay).
        mx.clear_cache()

    def close(self) -> None:
        self.prefix_cache = None
        self._waiting.clear()
        self._reading.clear()
        self._decoding, self._batch = [], None

    # --- admission ---------------------------------------------------------------

    def _admit(self) -> None:
        """Move waiting prompts to reading, oldest first, up to `MAX_PREFILL_ROWS`; one
        that shares an uncached prefix with a prompt being read waits for it."""
        held: list[_Row] = []
        while self._waiting and len(self._reading) < MAX_PREFILL_ROWS:
            row = self._waiting.popleft()
            if self._shares_uncached(row):
                held.append(row)
                continue
            cache, cached = None, 0
            if self.prefix_cache is not None:
                cache, cached = self.prefix_cache.fetch(row.prompt, row.spec.tenant)
                if cached:
                    log.debug("prefix cache hit: %d of %d tokens", cached, len(row.prompt))
            row.cache = cache if cache is not None else make_prompt_cache(self.model)
            row.cached = row.read = cached
            self._reading[row.spec.seq_id] = row
        self._waiting.extendleft(reversed(held))
        if self.prefix_cache is not None:  # live sequences count against the budget too
            live = forward.nbytes(self._batch)
            live += sum(forward.nbytes(r.cache) for r in self._reading.values())
            self.prefix_cache.fit(live)

    def _shares_uncached(self, row: _Row) -> bool:
        if self.prefix_cache is None:
            return False
        for other in self._reading.values():
            if other.spec.tenant != row.spec.tenant:  # it could not use the other's entry
                continue
            shared = _common_prefix(row.prompt, other.prompt)
            if shared >= SHARED_PREFIX and shared - other.cached >= SHARED_PREFIX:
                return True
        return False

    # --- rows --------------------------------------------------------------------

    def _sample(self, logits: mx.array, rows: list[_Row]) -> tuple[list[int], dict[int, Any]]:
        matchers, rngs = [r.matcher for r in rows], [r.rng for r in rows]
        if self.grammars is not None and any(m is not None for m in matchers):
            if self.masks is None or self.masks.vocab_size != logits.shape[-1]:
                self.masks = self.grammars.masks(logits.shape[-1])
            logits = self.masks.apply(logits, matchers)
        tokens, logprobs = self.sampler.sample(logits, [r.sampling for r in rows], rngs)
        for matcher, token in zip(matchers, tokens, strict=True):
            if matcher is not None:
                matcher.consume_token(token)
        return tokens, logprobs

    def _emit(self, row: _Row, token: int, vector: Any, *, first: bool) -> TokenStep:
        """The step reporting `token` for `row`, with its text and finish."""
        count = len(row.fed) + 1
        finish: Any = None
        if token in self._stop:
            finish = "stop"
        elif count >= row.sampling.max_tokens:
            finish = "length"
        detok = row.detokenizer
        if finish != "stop":  # the stop token itself is not text
            detok.add_token(token)
        if finish is not None:
            detok.finalize()
        logprob = None
        if vector is not None and finish != "stop":
            logprob = token_logprob(vector, token, row.sampling.top_logprobs, self._decode)
        row.last = token
        cached = row.cached if first else 0
        written = len(row.prompt) - row.cached if first and self.prefix_cache is not None else 0
        return TokenStep(
            row.spec.seq_id, token, detok.last_segment, finish, logprob, cached, written
        )

    def _decode(self, ids: list[int]) -> str:
        return str(self.tokenizer.decode(ids))

    def _join(self, rows: list[_Row]) -> None:
        """Rows whose prompt is read join the decode batch; their prompts' KV states are
        kept for later requests (the batch holds a copy)."""
        if not rows:
            return
        caches = [r.cache for r in rows if r.cache is not None]
        self._batch = forward.extend(self._batch, forward.merge(caches))
        self._decoding.extend(rows)
        for row in rows:
            self._keep_prompt(row)

    def _keep_prompt(self, row: _Row) -> None:
        if row.cache is not None and row.read > row.cached:
            self._keep(row, list(row.prompt), row.cache, "user")
        row.cache = None

    def _filter(self, keep: list[int]) -> None:
        if len(keep) == len(self._decoding):
            return
        self._decoding = [self._decoding[i] for i in keep]
        self._batch = None if self._batch is None else forward.keep_rows(self._batch, keep)

    @staticmethod
    def _tokens(row: _Row) -> list[int]:
        """The tokens a decoding row's KV state holds."""
        return [*row.prompt, *row.fed]

    def _keep(self, row: _Row, tokens: list[int], cache: KV, kind: CacheKind) -> None:
        """Keep a KV state of `row`'s as an entry of its tenant's."""
        if self.prefix_cache is not None and tokens and not self._suspect:
            self.prefix_cache.store(tokens, cache, kind, row.spec.tenant)


def _common_prefix(a: tuple[int, ...], b: tuple[int, ...]) -> int:
    n = min(len(a), len(b))
    if a[:SHARED_PREFIX] != b[:SHARED_PREFIX]:
        return 0
    lo, hi = SHARED_PREFIX, n  # the prefix is at least `lo` long; find its end by halving
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if a[:mid] == b[:mid]:
            lo = mid
        else:
            hi = mid - 1
    return lo


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
) -> LoadedModel:
    """Load a local MLX model folder and wrap it as an engine (on the model thread).

    `prefill_step_size` caps the prompt tokens one step reads (all prompts together);
    `max_step_ms` is the step length the prefill budget aims at (0: 1.5 times the
    decode step of a full batch of `max_batch` rows). `prompt_cache_bytes` bounds the KV states
    kept for reuse plus those of the live sequences (as `mlx_lm.server
    --prompt-cache-bytes` does); 0 disables the cache."""
    model, tokenizer = load(str(path))[:2]
    fast = install_cpu_forms(model)  # on the CPU device only; Apple GPUs keep MLX's kernels
    quantized = install_quantized_forms(model)  # likewise
    grammars = GrammarCompiler.for_hf_tokenizer(tokenizer._tokenizer)
    engine = MlxEngine(
        model,
        tokenizer,
        StepBudget(cap=prefill_step_size, full_batch=max_batch, max_step_ms=max_step_ms),
        grammars,
        None,
        PrefixCache(prompt_cache_bytes) if prompt_cache_bytes > 0 else None,
        Sampler(fast_log_softmax if fast else reference_log_softmax),
        _stop=frozenset(tokenizer.eos_token_ids),
    )
    version = getattr(mx, "__version__", "?")
    forms = ", CPU forms of exp-heavy ops" if fast else ""
    forms += f", CPU quantized matmul ({quantized} modules)" if quantized else ""
    backend = f"mlx {version} on {mx.default_device()}, BLAS: {blas.name}{forms}"
    model_type = json.loads((path / "config.json").read_text()).get("model_type")
    info = ModelInfo(
        name=name,
        path=str(path),
        context_length=ctx_size or context_length(path),
        backend=backend,
        tool_parser=detect_parser(getattr(tokenizer, "chat_template", None), model_type),
    )
    return LoadedModel(engine=engine, codec=TemplateCodec(tokenizer, grammars), info=info)
