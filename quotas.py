"""Per-key rate limits and quotas: requests and tokens a minute, tokens a UTC day.

Each tenant (the name of the API key a request carried; "" on a server without keys) is
held to the server's defaults (`--rate-limit-rpm`, `--rate-limit-tpm`,
`--daily-token-quota`) unless an override lookup gives it limits of its own. The counting
happens in the store (`StoreBackend.charge`), so replicas sharing a store share the
limits. A request is admitted while its tenant has tokens left this minute and today, and
while it is under its request rate, which counts it atomically: however many replicas
admit at once, no more than the limit get in. Its input and output tokens are charged
once its response has ended, so a request may overshoot the token limits by what it
spent; the next one is refused.
"""

from __future__ import annotations

import math
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Literal

from mlxcel.keys import KeyLimits
from mlxcel.store.backend import Charge

MINUTE_SECS = 60
DAY_SECS = 86_400

Kind = Literal["requests", "tokens", "daily"]


Overrides = Callable[[str], KeyLimits | None]
"""The limits a tenant has of its own (from the keys file), or None for the defaults."""


def no_overrides(tenant: str) -> KeyLimits | None:
    """Every tenant has the server's defaults."""
    del tenant
    return None


@dataclass(frozen=True, slots=True)
class Meter:
    """Where one limit of a tenant stands after a request was admitted or refused."""

    limit: int
    used: int
    resets_in: float
    """Seconds until its window ends and the count starts again."""

    @property
    def remaining(self) -> int:
        return max(0, self.limit - self.used)

    @property
    def retry_after_secs(self) -> int:
        """The window's end, in whole seconds (at least 1), as `Retry-After` says it."""
        return max(1, math.ceil(self.resets_in))


@dataclass(frozen=True, slots=True)
class Admission:
    """What the limiter decided for one request, and the meters its answer reports."""

    tenant: str
    limits: KeyLimits
    """The tenant's limits as they stood (its tokens are charged under the same)."""
    requests: Meter | None = None
    tokens: Meter | None = None
    daily: Meter | None = None
    refused: Kind | None = None
    """The limit that refused the request; None when it was admitted."""


SpendTokens = Callable[[int], Awaitable[None]]


class Limiter:
    """Admits requests and charges their tokens, per tenant, on the store's counters."""

    def __init__(
        self,
        charge: Callable[[str, int, int, int], Awaitable[Charge]],
        defaults: KeyLimits,
        overrides: Overrides = no_overrides,
    ) -> None:
        """`charge` is the store's (`StoreHandle.charge`); `defaults` has every limit set."""
        self._charge = charge
        self._defaults = defaults
        self._overrides = overrides

    def limits_of(self, tenant: str) -> KeyLimits:
        own = self._overrides(tenant)
        return self._defaults if own is None else own.over(self._defaults)

    async def admit(self, tenant: str) -> Admission:
        """Whether `tenant` may start a request now; counts it when it may. StoreUnavailable
        when the store cannot count."""
        limits = self.limits_of(tenant)
        if not limits.active:
            return Admission(tenant, limits)
        # The token limits are only read (their requests are charged as they end) ...
        tokens, _ = await self._meter("tokens", tenant, 0, limits.tpm, MINUTE_SECS)
        daily, _ = await self._meter("daily", tenant, 0, limits.daily, DAY_SECS)
        refused: Kind | None = None
        if daily is not None and daily.remaining == 0:
            refused = "daily"
        elif tokens is not None and tokens.remaining == 0:
            refused = "tokens"
        # ... and the request is counted only when nothing else refused it.
        amount = 1 if refused is None else 0
        requests, allowed = await self._meter("requests", tenant, amount, limits.rpm, MINUTE_SECS)
        if refused is None and not allowed:
            refused = "requests"
        return Admission(tenant, limits, requests, tokens, daily, refused)

    def spender(self, admission: Admission) -> SpendTokens | None:
        """What charges an admitted request's tokens once its response has ended; None
        when no token limit applies to it."""
        limits = admission.limits
        if not (limits.tpm or limits.daily):
            return None

        async def spend(tokens: int) -> None:
            if tokens <= 0:
                return
            if limits.tpm:
                await self._charge(_counter("tokens", admission.tenant), tokens, 0, MINUTE_SECS)
            if limits.daily:
                await self._charge(_counter("daily", admission.tenant), tokens, 0, DAY_SECS)

        return spend

    async def _meter(
        self, kind: Kind, tenant: str, amount: int, limit: int | None, window_secs: int
    ) -> tuple[Meter | None, bool]:
        """Where the limit stands (None when it is off), and whether `amount` was let in."""
        if not limit:
            return None, True
        charged = await self._charge(_counter(kind, tenant), amount, limit, window_secs)
        return Meter(limit, charged.used, charged.resets_in), charged.allowed


def _counter(kind: Kind, tenant: str) -> str:
    return f"{kind}:{tenant}"
