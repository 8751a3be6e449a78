"""Pearson's chi-square goodness-of-fit test, without scipy (not a dependency).

The p-value is the upper regularised incomplete gamma function Q(df / 2, x / 2), by its
series below `a + 1` and by its continued fraction (modified Lentz) above, as in
Numerical Recipes' `gammq`; `math.lgamma` gives the normalisation.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

EPS = 1e-15
TINY = 1e-300


def upper_gamma_q(a: float, x: float) -> float:
    """Q(a, x) = Γ(a, x) / Γ(a), for a > 0, x >= 0."""
    if x <= 0:
        return 1.0
    log_front = a * math.log(x) - x - math.lgamma(a)
    if x < a + 1:  # the series of P(a, x) converges fast here
        term = total = 1.0 / a
        n = a
        while abs(term) > abs(total) * EPS:
            n += 1
            term *= x / n
            total += term
        return max(0.0, 1.0 - total * math.exp(log_front))
    b = x + 1 - a  # the continued fraction of Q(a, x)
    c, d = 1 / TINY, 1 / b
    h = d
    i = 0
    while True:
        i += 1
        an = -i * (i - a)
        b += 2
        d = an * d + b
        d = TINY if abs(d) < TINY else d
        c = b + an / c
        c = TINY if abs(c) < TINY else c
        d = 1 / d
        delta = d * c
        h *= delta
        if abs(delta - 1) < EPS:
            return h * math.exp(log_front)


def chi_square_p(observed: Sequence[int], expected: Sequence[float]) -> float:
    """The p-value of `observed` counts against `expected` probabilities (summing to 1):
    bins of zero probability must be empty (a count there gives 0.0) and do not count
    as degrees of freedom."""
    total = sum(observed)
    statistic, bins = 0.0, 0
    for count, p in zip(observed, expected, strict=True):
        if p <= 0:
            if count:
                return 0.0
            continue
        want = total * p
        statistic += (count - want) ** 2 / want
        bins += 1
    return upper_gamma_q((bins - 1) / 2, statistic / 2)
