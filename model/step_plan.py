"""The step policy: how much prompt one engine step may read, and which prompts.

Every step first decodes one token for each running sequence, then reads prompts
within a budget. The budget bounds the gap every running stream sees: a step should
last about `max_step_ms`, by default `STEP_OVER_DECODE` (1.5) times what a decode step
of a full batch costs, so a burst of prompts stretches the inter-token latency by about
half, whatever their lengths, instead of stalling decoding while they are read. (The
cost model counts prefill per token; a forward's fixed cost, reading the weights, is not
in it yet, so steps with small chunks overshoot: docs/benchmarks.md has the figures.) Prompts share one budget per step
(not one each), and are read in rectangular chunks: rows of similar remaining length
go together so little is padded, and the oldest prompt always takes part, so none
waits for ever behind newer ones.

Pure Python, no MLX: the engine measures and executes, this module decides.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

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

_SMOOTHING = 0.3
"""Weight of the newest measurement in the running estimates."""


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
    """Prompt tokens a step may read, from running estimates of what steps cost.

    `max_step_ms` fixes the step length; 0 derives it: `STEP_OVER_DECODE` times the
    estimated decode step of the batch being built, the rows decoding plus the prompts
    waiting to join them (at most `full_batch`): 16 streams on a server of 64 slots
    are not slowed to the pace of 64.

    The decode cost is fitted as a line in the number of rows through the averages
    measured at each batch size; the prefill cost is an average per token. A decode row
    computes a token through the whole model, as a prompt token does, so the line rises
    at least by the prefill cost per row: that keeps the estimate for a larger batch
    honest while only a few sizes have been seen (a burst starts small), which would
    otherwise starve the prompts that make it grow. With nothing decoding there is no
    stream to protect and the budget is the cap; `cap` also bounds every step (memory
    and attention grow with the chunk).
    """

    cap: int
    full_batch: int
    max_step_ms: float = 0.0
    decode_ms: dict[int, float] = field(default_factory=dict)
    """The running average of a decode step, by batch size (at most `full_batch` keys)."""
    prefill_ms_per_token: float | None = None

    def observe_decode(self, rows: int, seconds: float) -> None:
        if rows <= 0:
            return
        rows = min(rows, self.full_batch)
        self.decode_ms[rows] = _smooth(self.decode_ms.get(rows), 1000 * seconds)

    def observe_prefill(self, tokens: int, seconds: float) -> None:
        # Small chunks are dominated by the fixed cost of a forward; they would
        # overstate the per-token cost and starve the next steps.
        if tokens >= 2 * MIN_PREFILL_TOKENS:
            per_token = 1000 * seconds / tokens
            self.prefill_ms_per_token = _smooth(self.prefill_ms_per_token, per_token)

    def estimate_decode_ms(self, rows: int) -> float | None:
        """The fitted cost of a decode step over `rows` rows (None before any)."""
        if not self.decode_ms:
            return None
        points = sorted(self.decode_ms.items())
        n = len(points)
        mean_x = sum(x for x, _ in points) / n
        mean_y = sum(y for _, y in points) / n
        var = sum((x - mean_x) ** 2 for x, _ in points)
        slope = sum((x - mean_x) * (y - mean_y) for x, y in points) / var if var else 0.0
        slope = max(slope, self.prefill_ms_per_token or 0.0)
        return max(min(y for _, y in points), mean_y + slope * (rows - mean_x))

    def step_ms(self, batch: int) -> float | None:
        """How long a step should last while a batch of `batch` rows is being built
        (None while nothing has been measured)."""
        if self.max_step_ms > 0:
            return self.max_step_ms
        full = self.estimate_decode_ms(min(batch, self.full_batch))
        return None if full is None else STEP_OVER_DECODE * full

    def tokens(self, decoding: int, batch: int | None = None) -> int:
        """Prompt tokens the next prefill may read, `decoding` rows having just decoded
        and `batch` rows to decode once the waiting prompts are read (default: a full
        batch)."""
        if decoding <= 0:
            return self.cap
        step = self.step_ms(self.full_batch if batch is None else max(batch, decoding))
        decode = self.estimate_decode_ms(decoding)
        if step is None or decode is None:
            return self.cap
        per_token = self.prefill_ms_per_token
        if per_token is None:
            # Before the first measurement: a forward over 32 tokens costs about as much
            # as a decode step of one row (weights are read once either way).
            per_token = (self.estimate_decode_ms(1) or decode) / 32
        allowed = int((step - decode) / per_token)
        return max(MIN_PREFILL_TOKENS, min(self.cap, allowed))


def _smooth(old: float | None, new: float) -> float:
    return new if old is None else (1 - _SMOOTHING) * old + _SMOOTHING * new
