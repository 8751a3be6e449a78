"""Per-key rate limits and quotas: requests and tokens a minute, tokens a UTC day.

Each tenant (the name of the API key a request carried; "" on a server without keys) is
held to the server's defaults (`--rate-limit-rpm`, `--rate-limit-tpm`,
`--daily-token-quota`) unless an override lookup gives it limits of its own. The counting
happens in the store (`StoreBackend.charge`), so replicas sharing a store share the
limits. A request is admitted while its tenant has tokens left this minute and today, and
while it is under its request rate, which counts it atomically: however many replicas
admit at once, no more than the limit get in. Once its input is known, and before it
runs, it reserves its input tokens plus its `max_output_tokens` on the token limits,
atomically and only while the tenant is under each: however many requests race, a key
spends at most its limit plus one request. When its response ends, what it did not spend
is returned (within the window it was reserved in).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Literal

import trio

from mlxcel.generation import SpendTokens
from mlxcel.keys import KeyLimits
from mlxcel.store import Charge

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

    async def reserve(
        self, admission: Admission, tokens: int
    ) -> tuple[SpendTokens | None, Admission]:
        """Hold `tokens` on the tenant's token limits for a request about to run. Answers
        what charges it as it ends (None when no token limit counts it) and the admission
        as it now stands: `refused` names the limit that let nothing more in (whatever was
        held on the other is returned). StoreUnavailable when the store cannot count."""
        limits = admission.limits
        holds: list[_Hold] = []
        kinds: tuple[tuple[Kind, int | None, int], ...] = (
            ("daily", limits.daily, DAY_SECS),
            ("tokens", limits.tpm, MINUTE_SECS),
        )
        for kind, limit, window_secs in kinds:
            if not limit:
                continue
            counter = _counter(kind, admission.tenant)
            charged = await self._charge(counter, tokens, limit, window_secs)
            if not charged.allowed:
                await _Spender(self._charge, holds, tokens)(0)
                meter = Meter(limit, charged.used, charged.resets_in)
                if kind == "daily":
                    return None, dataclasses.replace(admission, refused=kind, daily=meter)
                return None, dataclasses.replace(admission, refused=kind, tokens=meter)
            holds.append(_Hold(counter, window_secs, trio.current_time() + charged.resets_in))
        return (_Spender(self._charge, holds, tokens) if holds else None), admission

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


@dataclass(frozen=True, slots=True)
class _Hold:
    """Tokens held on one counter, in the window that ends at `ends` (Trio's clock)."""

    counter: str
    window_secs: int
    ends: float


Charger = Callable[[str, int, int, int], Awaitable[Charge]]


class _Spender:
    """A request's reservation, settled as it ends: tokens beyond it are charged, and
    what is left of it is returned, unless its window has ended meanwhile (the tokens
    then counted in a window that is over; returning them would lower the new one)."""

    def __init__(self, charge: Charger, holds: list[_Hold], reserved: int) -> None:
        self._charge = charge
        self._holds = holds
        self._left = reserved

    async def __call__(self, tokens: int, *, final: bool = True) -> None:
        prepaid = min(max(tokens, 0), self._left)
        self._left -= prepaid
        extra = max(tokens, 0) - prepaid
        unused, self._left = (self._left, 0) if final else (0, self._left)
        for hold in self._holds:
            if extra:
                await self._charge(hold.counter, extra, 0, hold.window_secs)
            if unused and trio.current_time() < hold.ends:
                await self._charge(hold.counter, -unused, 0, hold.window_secs)


class AdminBuckets:
    """Each admin key's model loads and unloads: a token bucket per key name that holds
    `per_minute` calls and refills at that rate, so a burst is bounded and the rate over
    time too. Per process, like the models it guards (each replica loads its own).

    Its one entry per key name is bounded by the admin keys there are: a key is counted
    here only once it is known to be an admin's."""

    def __init__(self, per_minute: int, clock: Callable[[], float] = trio.current_time) -> None:
        self.per_minute = per_minute
        self._clock = clock
        self._buckets: dict[str, tuple[float, float]] = {}
        """Key name → (calls left, when that was counted)."""

    def take(self, name: str) -> float:
        """Count one call by `name`: 0 when it may go ahead, else the seconds until it
        may (nothing is counted then). With `per_minute` 0 every call goes ahead."""
        if not self.per_minute:
            return 0.0
        now = self._clock()
        left, then = self._buckets.get(name, (float(self.per_minute), now))
        left = min(float(self.per_minute), left + (now - then) * self.per_minute / MINUTE_SECS)
        if left < 1:
            self._buckets[name] = (left, now)
            return (1 - left) * MINUTE_SECS / self.per_minute
        self._buckets[name] = (left - 1, now)
        return 0.0
