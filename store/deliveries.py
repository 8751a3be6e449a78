"""Webhook deliveries kept in the store, so a restart (SQLite) or another replica
(Redis) sends what a stopped process left unsent.

A delivery is one background response's announcement: kept from the job's admission
(its end still unknown, so a job reaped after a crash is announced too) until it is
delivered or given up. Each has a due time; `claim` takes the due ones and moves each
one's due time past a lease in the same step, so two replicas never take one delivery
at once, and one whose claimer died is due again once the lease is over. Times are the
backend's clock; callers speak only in delays.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Protocol

import trio

MAX_PENDING = 10_000
"""Deliveries a store keeps at most; beyond it a new one is refused (and logged), so an
unreachable receiver cannot grow the store without bound."""


@dataclass(frozen=True, slots=True)
class Delivery:
    """One announcement: the event's id (the same on every attempt), the response it
    announces, whose response it is (its tenant picks the target when it is sent), how
    it ended (None until known), when the event was made and the attempts failed so far."""

    response_id: str
    event_id: str
    tenant: str
    status: str | None = None
    created_at: int = 0
    attempts: int = 0


def encode_delivery(delivery: Delivery) -> str:
    return json.dumps(asdict(delivery), separators=(",", ":"))


def decode_delivery(body: str | bytes) -> Delivery:
    return Delivery(**json.loads(body))


class Deliveries(Protocol):
    """The store's pending deliveries; each operation one atomic step of its backend."""

    async def add(self, delivery: Delivery, delay_secs: float, *, settle: bool = False) -> bool:
        """Keep `delivery` (replacing what its response had), due after `delay_secs`;
        False when `MAX_PENDING` others are kept and it is new. With `settle`, only
        replace one still kept (one delivered meanwhile is never brought back)."""
        ...

    async def claim(self, limit: int, lease_secs: float) -> tuple[Delivery, ...]:
        """Up to `limit` due deliveries, earliest first, each made due again only after
        `lease_secs` (its claimer settles it with `add` or `drop` before then)."""
        ...

    async def drop(self, response_id: str) -> bool:
        """Forget the delivery of `response_id` (delivered or given up); whether it was kept."""
        ...


class MemoryDeliveries:
    """`Deliveries` in this process's memory (gone with it, as everything it stores)."""

    def __init__(self, clock: Callable[[], float] = trio.current_time) -> None:
        self._clock = clock
        self._kept: dict[str, tuple[float, Delivery]] = {}

    def _now(self) -> float:
        return self._clock()

    async def add(self, delivery: Delivery, delay_secs: float, *, settle: bool = False) -> bool:
        await trio.lowlevel.checkpoint()
        if delivery.response_id not in self._kept and (settle or len(self._kept) >= MAX_PENDING):
            return False
        self._kept[delivery.response_id] = (self._now() + delay_secs, delivery)
        return True

    async def claim(self, limit: int, lease_secs: float) -> tuple[Delivery, ...]:
        await trio.lowlevel.checkpoint()
        now = self._now()
        due = sorted((at, d.response_id) for at, d in self._kept.values() if at <= now)
        taken = []
        for _, response_id in due[:limit]:
            delivery = self._kept[response_id][1]
            self._kept[response_id] = (now + lease_secs, delivery)
            taken.append(delivery)
        return tuple(taken)

    async def drop(self, response_id: str) -> bool:
        await trio.lowlevel.checkpoint()
        return self._kept.pop(response_id, None) is not None
