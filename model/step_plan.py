"""The step policy: how much prompt one engine step may read, and which prompts.

Every step decodes one token for each running sequence and reads prompts within a
budget, in one forward where the model allows it. The budget bounds the gap every
running stream sees: a step should last about `max_step_ms`, by default
`STEP_OVER_DECODE` (1.5) times what a decode step of a full batch costs, so a burst of
prompts stretches the inter-token latency by about half, whatever their lengths,
instead of stalling decoding while they are read; what a step costs is fitted from
measured steps (`step_cost`). Prompts share one budget per step (not one each), and are read in rectangular chunks: rows of similar remaining length
go together so little is padded, and the oldest prompt always takes part, so none
waits for ever behind newer ones.

Pure Python, no MLX: the engine measures and executes, this module decides.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

from mlxcel.model.step_cost import StepCostModel

STEP_OVER_DECODE = 1.5
"""The derived step length, in full-batch decode steps. Every second of prefill delays
every running stream by a second, so this trades their inter-token gaps (at most this
many times the usual one) against how fast a burst of prompts is read."""

MIN_PREFILL_TOKENS = 16
"""A step with prompts waiting reads at least this many tokens, however dear decoding is."""

MAX_PREFILL_ROWS = 16
"""Prompts read together in one chunk at most (each holds its KV state while read)."""

MAX_PADDING = 0.25
"""Share of a chunk that may be padding (rows ending their prompt short of the chunk)."""


@dataclass(frozen=True, slots=True)
class Waiting:
    """A prompt being read: its key and how many of its tokens are left."""

    key: int
    remaining: int


@dataclass(frozen=True, slots=True)
class Chunk:
    """One prefill forward: each row reads `min(remaining, length)` tokens, the shorter
    ones padded to `length`; `reads[i]` is what row `keys[i]` reads."""

    keys: tuple[int, ...]
    reads: tuple[int, ...]
    length: int

    @property
    def tokens(self) -> int:
        """Tokens the forward computes, padding included (what the budget counts)."""
        return self.length * len(self.keys)


def plan_chunk(
    waiting: Sequence[Waiting], budget: int, max_rows: int = MAX_PREFILL_ROWS
) -> Chunk | None:
    """The chunk to read this step from `waiting` (oldest first), within `budget` tokens.

    The oldest prompt always takes part and sets the chunk's length (its remainder, or
    the whole budget for a longer one). Later prompts join in order while the chunk
    stays within the budget and its padding within `MAX_PADDING`; one that is longer
    than the chunk may stretch it up to its own remainder when that still fits.
    """
    if not waiting or budget <= 0:
        return None
    head = waiting[0]
    length = min(head.remaining, budget)
    rows = [head]
    for row in waiting[1:]:
        if len(rows) >= max_rows:
            break
        stretched = max(length, min(row.remaining, budget // (len(rows) + 1)))
        if stretched * (len(rows) + 1) > budget:
            continue
        candidate = [*rows, row]
        padding = sum(max(0, stretched - r.remaining) for r in candidate)
        if padding > MAX_PADDING * stretched * len(candidate):
            continue
        rows, length = candidate, stretched
    reads = tuple(min(r.remaining, length) for r in rows)
    return Chunk(tuple(r.key for r in rows), reads, length)


@dataclass
class StepBudget:
    """Prompt tokens a step may read, from the fitted cost of steps (`step_cost`).

    `max_step_ms` fixes the step length; 0 derives it: `STEP_OVER_DECODE` times the
    estimated decode step of the batch being built, the rows decoding plus the prompts
    waiting to join them (at most `full_batch`): 16 streams on a server of 64 slots
    are not slowed to the pace of 64. The prompt tokens are what the rest of the step
    buys at the fitted per-token cost, the rows' own cost and the forward's fixed part
    paid first (twice when the prompt is read in a forward of its own). With nothing
    decoding there is no stream to protect and the budget is the cap; `cap` also
    bounds every step (memory and attention grow with the chunk).
    """

    cap: int
    full_batch: int
    max_step_ms: float = 0.0
    costs: StepCostModel = field(default_factory=StepCostModel)

    def observe(self, rows: int, tokens: int, seconds: float, scores: int = 0) -> None:
        """A step decoded `rows` rows and read `tokens` prompt tokens in `seconds`,
        `scores` attention scores in all."""
        self.costs.observe(min(rows, self.full_batch), tokens, seconds, scores)

    def step_ms(self, batch: int, context: float = 0.0) -> float | None:
        """How long a step should last while a batch of `batch` rows is being built,
        rows holding `context` tokens on average (None while nothing has been measured)."""
        if self.max_step_ms > 0:
            return self.max_step_ms
        cost = self.costs.cost()
        if cost is None:
            return None
        rows = min(batch, self.full_batch)
        return STEP_OVER_DECODE * cost.ms(rows, 0, rows * context / 1000)

    def tokens(
        self,
        decoding: int,
        batch: int | None = None,
        *,
        separate: bool = False,
        context: float = 0.0,
        offset: int = 0,
    ) -> int:
        """Prompt tokens the next step may read beside `decoding` rows holding `context`
        tokens on average, `batch` rows to decode once the waiting prompts are read
        (default: a full batch), the chunk starting `offset` tokens into its prompt;
        `separate`: in a forward of their own, which pays the fixed part again."""
        if decoding <= 0:
            return self.cap
        step = self.step_ms(self.full_batch if batch is None else max(batch, decoding), context)
        cost = self.costs.cost()
        if step is None or cost is None:
            return self.cap
        spent = cost.ms(decoding, 0, decoding * context / 1000)
        left = step - spent - (cost.fixed if separate else 0.0)
        allowed = int(_affordable(left, cost.per_token, cost.per_kscore, offset))
        return max(MIN_PREFILL_TOKENS, min(self.cap, allowed))


def _affordable(ms: float, per_token: float, per_kscore: float, offset: int) -> float:
    """The most tokens `t` a chunk at `offset` may read in `ms`: each costs `per_token`
    and attends to the `offset + i` positions before it, `t · offset + t² / 2` scores."""
    if ms <= 0:
        return 0.0
    a = per_kscore / 2000
    b = per_token + per_kscore * offset / 1000
    if a <= 0:
        return ms / b
    return (-b + math.sqrt(b * b + 4 * a * ms)) / (2 * a)
