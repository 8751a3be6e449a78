"""What an engine step costs: `fixed + per_row · rows + per_token · prompt_tokens +
per_kscore · attention_scores / 1000`.

A step is one forward over the decode rows' tokens and the prompt tokens read with
them. Whatever it computes, a forward reads all the weights: on a CPU that fixed part
is as large as a one-row decode step, so a cost counted per token alone mistakes it for
a per-token cost (about twice the true one, with small chunks) and buys half the prompt
a step could read. The three parts are fitted here by least squares, none negative,
from the engine's own measurements of recent steps, the newer weighing more (a machine
gets busier, a context grows). The fourth part is attention's: a token attends to every
position before it, so a chunk deep into a long prompt, or rows far into their
replies, cost more per token than the same shapes at the start; counted apart, the
budget buys fewer tokens deep in a prompt instead of overrunning the step there.

Pure Python: the engine measures, this module fits.
"""

from __future__ import annotations

import itertools
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field

WINDOW = 48
"""Steps the fit remembers: enough to span the shapes one burst goes through (decode
batches of every size, chunks of every length), few enough to follow a change."""

DECAY = 0.95
"""Weight of a step, relative to the step after it."""


Sample = tuple[int, int, float, float]
"""A measured step: `(rows, prompt_tokens, kscores, ms)`; kscores are the step's
attention scores (query-key pairs, per layer and head) in thousands."""


@dataclass(frozen=True, slots=True)
class StepCost:
    """Fitted milliseconds of a step: `fixed + per_row · rows + per_token · tokens +
    per_kscore · kscores`."""

    fixed: float
    per_row: float
    per_token: float
    per_kscore: float = 0.0

    def ms(self, rows: int, tokens: int = 0, kscores: float = 0.0) -> float:
        return (
            self.fixed + self.per_row * rows + self.per_token * tokens + self.per_kscore * kscores
        )


@dataclass
class StepCostModel:
    """The running fit over the last `WINDOW` steps."""

    samples: deque[Sample] = field(default_factory=lambda: deque(maxlen=WINDOW))
    _fit: StepCost | None = None

    def observe(self, rows: int, tokens: int, seconds: float, scores: int = 0) -> None:
        """A step of `rows` decode rows and `tokens` prompt tokens, `scores` attention
        scores in all, took `seconds`."""
        if rows <= 0 and tokens <= 0:
            return
        self.samples.append((rows, tokens, scores / 1000, 1000 * seconds))
        self._fit = None

    def cost(self) -> StepCost | None:
        """The fit (None before any step). Parts the steps seen cannot tell apart are
        filled in from the others: a decode row computes a token through the whole
        model, as a prompt token does, so it costs at least as much; before any prompt
        was read, a forward over 32 prompt tokens is taken to cost a one-row step."""
        if not self.samples:
            return None
        if self._fit is None:
            self._fit = fit(list(self.samples))
        return self._fit


def fit(samples: Sequence[Sample]) -> StepCost:
    """Weighted non-negative least squares over the samples, oldest first."""
    n = len(samples)
    weights = [DECAY ** (n - 1 - i) for i in range(n)]
    columns = (
        [1.0] * n,
        [float(r) for r, _, _, _ in samples],
        [float(t) for _, t, _, _ in samples],
        [k for _, _, k, _ in samples],
    )
    y = [ms for _, _, _, ms in samples]
    best: tuple[float, list[float]] | None = None
    # The best non-negative solution is an unconstrained one on some subset of the
    # parts with the others at zero: four parts, fifteen subsets.
    for size in (4, 3, 2, 1):
        for subset in itertools.combinations(range(4), size):
            solved = _least_squares([columns[j] for j in subset], y, weights)
            if solved is None or min(solved) < 0:
                continue
            coef = [0.0, 0.0, 0.0, 0.0]
            for j, value in zip(subset, solved, strict=True):
                coef[j] = value
            error = sum(
                w * (yi - sum(c[i] * coef[j] for j, c in enumerate(columns))) ** 2
                for i, (w, yi) in enumerate(zip(weights, y, strict=True))
            )
            if best is None or error < best[0] - 1e-9:
                best = (error, coef)
    fixed, per_row, per_token, per_kscore = best[1] if best is not None else [0.0] * 4
    read = any(t > 0 for _, t, _, _ in samples)
    if not read or per_token <= 0:
        one_row = fixed + per_row if per_row > 0 else max(y) / max(1, max(columns[1]))
        per_token = max(per_token, one_row / 32)
    per_row = max(per_row, per_token)
    # The floors moved the line: the fixed part takes up what is left, on average.
    residual = sum(
        w * (ms - per_row * r - per_token * t - per_kscore * k)
        for w, (r, t, k, ms) in zip(weights, samples, strict=True)
    ) / sum(weights)
    return StepCost(max(0.0, residual), per_row, per_token, per_kscore)


def _least_squares(
    columns: Sequence[Sequence[float]], y: Sequence[float], w: Sequence[float]
) -> list[float] | None:
    """Weighted least squares by the normal equations; None when they are singular."""
    k = len(columns)
    a = [
        [
            sum(wi * ci * cj for wi, ci, cj in zip(w, columns[r], columns[c], strict=True))
            for c in range(k)
        ]
        for r in range(k)
    ]
    b = [sum(wi * ci * yi for wi, ci, yi in zip(w, columns[r], y, strict=True)) for r in range(k)]
    diagonal = [abs(a[i][i]) for i in range(k)]
    for col in range(k):  # Gaussian elimination with partial pivoting
        pivot = max(range(col, k), key=lambda r: abs(a[r][col]))
        if abs(a[pivot][col]) <= 1e-9 * diagonal[col]:
            return None
        a[col], a[pivot], b[col], b[pivot] = a[pivot], a[col], b[pivot], b[col]
        for r in range(col + 1, k):
            f = a[r][col] / a[col][col]
            a[r] = [x - f * p for x, p in zip(a[r], a[col], strict=True)]
            b[r] -= f * b[col]
    out = [0.0] * k
    for r in reversed(range(k)):
        out[r] = (b[r] - sum(a[r][c] * out[c] for c in range(r + 1, k))) / a[r][r]
    return out
