"""The MLX engine: continuous batching with our own step policy over mlx-lm's models.

A step has two phases, and the model actor delivers each one's tokens before the next
runs. `decode` feeds every running row (`decode_batch`) its last token and, in the same
forward (`flat_forward`), the prompt chunk the step's budget allows (`step_plan`). Then
`prefill` samples the first token of each prompt the chunk finished, which joins the
decode batch. With nothing decoding, or a model whose forward cannot be shared, `prefill`
reads the chunk in a forward of its own. So decoding never waits behind more prompt than
the budget allows, the weights are read once a step, and no forward is spent on a first
token.

Prompts wait in a FIFO and are admitted to reading a few at a time; the prefix cache is
consulted at admission, not at insert, so a request queued while a shared prefix is
being read finds it. A waiting prompt that shares an uncached prefix (`SHARED_PREFIX`
tokens or more) with one being read waits for that one to finish, then starts from
its KV state. KV states are kept when a prompt is read, when a sequence finishes (with
its generated tokens, which a follow-up turn resends) and when one is removed midway.

Import this module only on the model thread, after `load_fast_blas()`.
"""

from __future__ import annotations

import logging
import os
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any

from mlxcel.generation import PrefillProgress, SequenceSpec, TokenStep
from mlxcel.model.control_tokens import ControlMask
from mlxcel.model.grammar.constrained import GrammarCompiler, GrammarMasks
from mlxcel.model.step_plan import MAX_PREFILL_ROWS, Chunk, StepBudget, Waiting, plan_chunk

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # weights are local; never reach for a hub

import mlx.core as mx
from mlx_lm.models.cache import make_prompt_cache

from mlxcel.model import flat_forward, forward
from mlxcel.model.cache.prefix import CacheKind, PrefixCache, common_prefix
from mlxcel.model.decode_batch import DecodeBatch
from mlxcel.model.forward import KV
from mlxcel.model.native.fused_layer import FusedLayers
from mlxcel.model.penalties import RowPenalties, adjust
from mlxcel.model.rows import ChunkRead, Row
from mlxcel.model.sampling import Sampler, row_generator, token_logprob

log = logging.getLogger(__name__)

SHARED_PREFIX = 32
"""Uncached prompt tokens two waiting prompts must share for one to wait for the other."""


@dataclass
class MlxEngine:
    """The real engine: a batch of sequences on an MLX model, continuous batching over decode
    groups, chunked prefill within the step budget, sampling, grammars on the logits and
    the prompt cache. Called only from the model actor's thread."""

    model: Any
    tokenizer: Any
    budget: StepBudget
    grammars: GrammarCompiler | None = None
    masks: GrammarMasks | None = None
    prefix_cache: PrefixCache | None = None
    sampler: Sampler = field(default_factory=Sampler)
    flat: bool = False
    """Decode rows and the step's prompt chunk share one forward (`flat_forward`)."""
    fused: FusedLayers | None = None
    """Each layer's work around attention as two native nodes (`native/fused_layer.py`)."""
    control: ControlMask = field(default_factory=lambda: ControlMask(()))
    """The special tokens no row may sample (`model/control_tokens.py`)."""
    _waiting: deque[Row] = field(default_factory=deque)
    """Inserted, not yet admitted to reading (FIFO)."""
    _reading: dict[int, Row] = field(default_factory=dict)
    """Admitted, prompt being read, in admission order."""
    _running: DecodeBatch[Row] = field(default_factory=DecodeBatch)
    """The decoding rows and their KV states."""
    _read: ChunkRead | None = None
    """The chunk the decode forward read, its first tokens not yet sampled."""
    _stop: frozenset[int] = frozenset()
    _suspect: bool = False
    """A step failed: KV states may not match their tokens, so none are kept until
    every sequence is gone."""

    def __post_init__(self) -> None:
        if not self.flat:  # one forward, so one batched state
            self._running.max_groups = 1

    # --- the engine protocol -------------------------------------------------------

    def insert(self, spec: SequenceSpec) -> None:
        sampling = spec.sampling
        if not spec.prompt:
            raise ValueError("empty prompt")
        matcher = None
        if sampling.grammar is not None and self.grammars is not None:
            matcher = self.grammars.matcher(sampling.grammar)
        rng, penalties = row_generator(sampling.seed), RowPenalties.for_sampling(sampling)
        self._waiting.append(
            Row(spec, self.tokenizer.detokenizer, matcher, rng=rng, penalties=penalties)
        )

    def decode(self) -> list[TokenStep]:
        """One token for every running row; where the model allows it, the same forward
        reads the step's prompt chunk too (its first tokens come with `prefill`)."""
        if not self._running:
            return []
        started = time.perf_counter()
        self._suspect = True
        rows = self._running.rows
        groups = self._running.groups()
        chunk = self._plan(separate=False) if self.flat else None
        scores = sum(r.held for r in rows) + self._scores(chunk)
        if chunk is not None:
            logits, self._read = self._read_with(chunk, groups)
        elif len(groups) == 1:
            logits = flat_forward.one_group_logits(self.model, groups[0], self.fused)
        else:  # several states (`decode_batch`): still one forward
            logits = flat_forward.joined(flat_forward.step_logits(self.model, groups, self.fused))
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
                self._keep(row, row.tokens, self._running.extract(i), "assistant")
        self._running.keep(keep)
        read = 0 if chunk is None else chunk.tokens
        self.budget.observe(len(rows), read, time.perf_counter() - started, scores)
        return steps

    def prefill(self) -> list[TokenStep]:
        """The first tokens of the prompts the step finished reading: those of the
        decode forward's chunk, or, with nothing decoding (or a model that cannot share
        a forward), a chunk read now within the budget."""
        done, self._read = self._read, None
        if done is None and (not self._running or not self.flat):
            chunk = self._plan(separate=True)
            if chunk is not None:
                started, scores = time.perf_counter(), self._scores(chunk)
                done = self._read_alone(chunk)
                self.budget.observe(0, chunk.tokens, time.perf_counter() - started, scores)
        return [] if done is None else self._finish(done)

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
        rows = self._running.rows
        for i, row in enumerate(rows):
            if row.spec.seq_id == seq_id:
                if keep:
                    self._keep(row, row.tokens, self._running.extract(i), "assistant")
                self._running.keep([j for j in range(len(rows)) if j != i])
                break
        if not self.has_work():
            self._suspect = False

    def has_work(self) -> bool:
        return bool(self._waiting or self._reading or self._running)

    def idle(self) -> None:
        # MLX keeps freed buffers (after a burst, a whole batch's KV caches): return them
        # when there is nothing to do (the prefix cache's arrays are in use and stay).
        mx.clear_cache()

    def spill_prompt_cache(self) -> int:
        """Every prompt-cache entry to the disk tier (before an unload; `close` does too)."""
        return 0 if self.prefix_cache is None else self.prefix_cache.spill_all()

    def close(self) -> None:
        if self.prefix_cache is not None:
            self.prefix_cache.close()  # spills to its disk tier and waits for the writes
        self.prefix_cache = None
        self._waiting.clear()
        self._reading.clear()
        self._running.clear()

    # --- reading prompts ----------------------------------------------------------

    def _plan(self, *, separate: bool) -> Chunk | None:
        """The chunk this step reads, within the budget (`separate`: in its own forward)."""
        self._admit()
        waiting = [Waiting(k, len(r.prompt) - r.read) for k, r in self._reading.items()]
        decoding = len(self._running)
        batch = decoding + len(self._reading) + len(self._waiting)
        context = sum(r.held for r in self._running.rows) / max(1, decoding)
        offset = next((r.read for r in self._reading.values()), 0)  # the oldest sets the length
        budget = self.budget.tokens(
            decoding, batch, separate=separate, context=context, offset=offset
        )
        return plan_chunk(waiting, budget)

    def _scores(self, chunk: Chunk | None) -> int:
        """The chunk's attention scores (padding included), per layer and head: each of
        its tokens attends to every position before it."""
        if chunk is None:
            return 0
        n = chunk.length
        return sum(n * self._reading[k].read + n * n // 2 for k in chunk.keys)

    def _parts(self, chunk: Chunk) -> tuple[list[Row], list[tuple[int, ...]], list[bool]]:
        """The chunk's rows, the tokens each reads, and whether that ends its prompt."""
        rows = [self._reading[k] for k in chunk.keys]
        parts = [r.prompt[r.read : r.read + n] for r, n in zip(rows, chunk.reads, strict=True)]
        ending = [r.read + n == len(r.prompt) for r, n in zip(rows, chunk.reads, strict=True)]
        return rows, parts, ending

    def _read_with(
        self, chunk: Chunk, groups: list[flat_forward.Group]
    ) -> tuple[mx.array, ChunkRead]:
        """One forward: the decode rows' next logits, and the chunk read."""
        rows, parts, ending = self._parts(chunk)
        opened = forward.open_chunk(parts, [r.cache for r in rows if r.cache is not None])
        reading = flat_forward.Group(opened.tokens, opened.cache, opened.want(ending))
        *decoded, firsts = flat_forward.step_logits(self.model, [*groups, reading], self.fused)
        logits = flat_forward.joined(decoded)
        caches = forward.close_chunk(opened)
        mx.eval(logits, firsts, [layer.state for kv in caches for layer in kv])
        ended = [i for i, e in enumerate(ending) if e]
        return logits, self._advance(rows, chunk, caches, ended, list(firsts) if ended else [])

    def _read_alone(self, chunk: Chunk) -> ChunkRead:
        """The chunk in a forward of its own."""
        self._suspect = True
        rows, parts, ending = self._parts(chunk)
        caches, logits = forward.read_chunk(
            self.model, parts, [r.cache for r in rows if r.cache is not None], ending
        )
        ended = [i for i, e in enumerate(ending) if e]
        read = self._advance(rows, chunk, caches, ended, [logits[i] for i in ended])
        self._suspect = False  # the KV states hold what each row read: safe to keep
        return read

    @staticmethod
    def _advance(
        rows: list[Row], chunk: Chunk, caches: list[KV], ended: list[int], logits: list[mx.array]
    ) -> ChunkRead:
        """Move the rows past what the chunk read; what it finished, with the logits."""
        for row, n, cache in zip(rows, chunk.reads, caches, strict=True):
            row.cache, row.read = cache, row.read + n
        return ChunkRead(tuple(rows[i].spec.seq_id for i in ended), tuple(logits))

    def _finish(self, read: ChunkRead) -> list[TokenStep]:
        """Sample the first token of every prompt the chunk finished (those still
        there: one may have been removed since), and let them join the decode batch."""
        alive = [(n, self._reading[k]) for n, k in enumerate(read.ended) if k in self._reading]
        if not alive:
            return []
        firsts = [row for _, row in alive]
        tokens, logprobs = self._sample(mx.stack([read.logits[n] for n, _ in alive]), firsts)
        steps: list[TokenStep] = []
        joining: list[Row] = []
        for n, (row, token) in enumerate(zip(firsts, tokens, strict=True)):
            del self._reading[row.spec.seq_id]
            step = self._emit(row, token, logprobs.get(n), first=True)
            steps.append(step)
            if step.finish is None:
                joining.append(row)
            else:
                self._keep_prompt(row)
        self._join(joining)
        return steps

    # --- admission ---------------------------------------------------------------

    def _admit(self) -> None:
        """Move waiting prompts to reading, oldest first, up to `MAX_PREFILL_ROWS`; one
        that shares an uncached prefix with a prompt being read waits for it."""
        held: list[Row] = []
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
            live = self._running.nbytes()
            live += sum(forward.nbytes(r.cache) for r in self._reading.values())
            self.prefix_cache.fit(live)

    def _shares_uncached(self, row: Row) -> bool:
        if self.prefix_cache is None:
            return False
        for other in self._reading.values():
            if other.spec.tenant != row.spec.tenant:  # it could not use the other's entry
                continue
            shared = common_prefix(row.prompt, other.prompt, SHARED_PREFIX)
            if shared >= SHARED_PREFIX and shared - other.cached >= SHARED_PREFIX:
                return True
        return False

    # --- rows --------------------------------------------------------------------

    def _sample(self, logits: mx.array, rows: list[Row]) -> tuple[list[int], dict[int, Any]]:
        matchers, rngs = [r.matcher for r in rows], [r.rng for r in rows]
        penalties = [r.penalties for r in rows]
        if any(p is not None for p in penalties):
            logits = adjust(logits, penalties)
        if self.grammars is not None and any(m is not None for m in matchers):
            if self.masks is None or self.masks.vocab_size != logits.shape[-1]:
                self.masks = self.grammars.masks(logits.shape[-1])
            logits = self.masks.apply(logits, matchers)
        logits = self.control.apply(logits)
        tokens, logprobs = self.sampler.sample(logits, [r.sampling for r in rows], rngs)
        for matcher, penalty, token in zip(matchers, penalties, tokens, strict=True):
            if matcher is not None:
                matcher.consume_token(token)
            if penalty is not None:
                penalty.note(token)
        return tokens, logprobs

    def _emit(self, row: Row, token: int, vector: Any, *, first: bool) -> TokenStep:
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

    def _join(self, rows: list[Row]) -> None:
        """Rows whose prompt is read join the decode batch; their prompts' KV states are
        kept for later requests (the batch holds a copy)."""
        if not rows:
            return
        self._running.join(rows, [r.cache for r in rows if r.cache is not None])
        for row in rows:
            self._keep_prompt(row)

    def _keep_prompt(self, row: Row) -> None:
        if row.cache is not None and row.read > row.cached:
            self._keep(row, list(row.prompt), row.cache, "user")
        row.cache = None

    def _keep(self, row: Row, tokens: list[int], cache: KV, kind: CacheKind) -> None:
        """Keep a KV state of `row`'s as an entry of its tenant's."""
        if self.prefix_cache is not None and tokens and not self._suspect:
            self.prefix_cache.store(tokens, cache, kind, row.spec.tenant)
