"""Webhook deliveries kept in the store, so a restart (SQLite) or another replica
(Redis) sends what a stopped process left unsent.

A delivery is one background response's announcement: kept from the job's admission
(its end still unknown, so a job reaped after a crash is announced too) until it is
delivered or given up. Each has a due time; `claim` takes the due ones and moves each
one's due time past a lease in the same step, so two replicas never take one delivery
at once, and one whose claimer died is due again once the lease is over. A claim takes
at most a given number of each tenant's, so a sender whose attempts for one tenant are
at their bound still takes every other tenant's. The store keeps at most `MAX_PENDING`
in all and, when the caller says, at most a share of them per tenant. Times are the
backend's clock; callers speak only in delays.
"""

from __future__ import annotations

import enum
import json
import logging
from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from dataclasses import asdict, dataclass
from typing import Protocol

import trio

from mlxcel.store.codec import CodecError

log = logging.getLogger(__name__)

MAX_PENDING = 10_000
"""Deliveries a store keeps at most; beyond it a new one is refused (and logged), so an
unreachable receiver cannot grow the store without bound."""


class Added(enum.Enum):
    """What `Deliveries.add` did; true only when the delivery is kept."""

    KEPT = "kept"
    GONE = "gone"
    """To settle, but no longer kept (delivered or given up meanwhile): not brought back."""
    KNOWN = "known"
    """To settle an unknown end, but the end kept is known already: left as it is."""
    FULL = "full"
    """New, and the store keeps `MAX_PENDING`."""
    TENANT_FULL = "tenant_full"
    """New, and its tenant keeps its share."""

    def __bool__(self) -> bool:
        return self is Added.KEPT


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
    """A kept delivery read back; CodecError when the bytes are not one this release
    writes (a later release's, or damaged): a backend answers it as any stored value it
    cannot read."""
    try:
        delivery = Delivery(**json.loads(body))
    except (ValueError, TypeError, RecursionError) as exc:
        raise CodecError(f"not a delivery: {exc}") from None
    texts = (delivery.response_id, delivery.event_id, delivery.tenant)
    numbers = (delivery.created_at, delivery.attempts)
    if not (
        all(isinstance(t, str) for t in texts)
        and isinstance(delivery.status, str | None)
        and all(type(n) is int for n in numbers)
    ):
        raise CodecError("a delivery's fields are not of their types")
    return delivery


class UnreadableDeliveries:
    """Reads a claim's deliveries back. One this release cannot read is left as stored
    (a release that reads it may send it), claimed like the others, so it is due again
    only after the lease and never in the way of the rest, and warned about once; the
    ids remembered for that are at most `MAX_PENDING`, the most the store keeps."""

    def __init__(self) -> None:
        self._known: set[str] = set()

    def readable(self, claimed: Iterable[tuple[str, str | bytes]]) -> tuple[Delivery, ...]:
        """Each claimed (response id, stored bytes) read back, those unreadable left out."""
        found: list[Delivery] = []
        for response_id, body in claimed:
            try:
                found.append(decode_delivery(body))
            except CodecError as exc:
                if response_id not in self._known:
                    if len(self._known) >= MAX_PENDING:
                        self._known.clear()
                    self._known.add(response_id)
                    log.warning(
                        "the pending webhook delivery of response %s cannot be read (%s); "
                        "it is left as stored",
                        response_id,
                        exc,
                    )
        return tuple(found)


def room_of(tenant: str, each: int | None, rooms: Mapping[str, int] | None) -> int | None:
    """How many of `tenant`'s deliveries a claim may take: its own room when `rooms` names
    it, else `each` (None: no bound)."""
    if rooms is not None and tenant in rooms:
        return rooms[tenant]
    return each


class Deliveries(Protocol):
    """The store's pending deliveries; each operation one atomic step of its backend."""

    async def add(
        self,
        delivery: Delivery,
        delay_secs: float,
        *,
        settle: bool = False,
        unknown_only: bool = False,
        share: int | None = None,
    ) -> Added:
        """Keep `delivery` (replacing what its response had), due after `delay_secs`. A
        new one is refused when `MAX_PENDING` others are kept, or `share` (when given)
        of its tenant's. With `settle`, only replace one still kept (one delivered
        meanwhile is never brought back); with `unknown_only` too, only one whose end
        is not known yet, so that a job's end and a recheck that read it, racing, make
        it due once and never cut short the claim of an attempt already sending it."""
        ...

    async def claim(
        self,
        limit: int,
        lease_secs: float,
        *,
        each: int | None = None,
        rooms: Mapping[str, int] | None = None,
    ) -> tuple[Delivery, ...]:
        """Up to `limit` due deliveries, each made due again only after `lease_secs` (its
        claimer settles it with `add` or `drop` before then), and of each tenant at most
        `room_of` it. Tenants are taken in the order of their earliest due delivery, each
        tenant's earliest first."""
        ...

    async def drop(self, response_id: str) -> bool:
        """Forget the delivery of `response_id` (delivered or given up); whether it was kept."""
        ...


class MemoryDeliveries:
    """`Deliveries` in this process's memory (gone with it, as everything it stores)."""

    def __init__(self, clock: Callable[[], float] = trio.current_time) -> None:
        self._clock = clock
        self._kept: dict[str, tuple[float, Delivery]] = {}
        self._tenants: Counter[str] = Counter()
        """How many each tenant has kept (none at 0: a tenant leaves with its last)."""

    def _now(self) -> float:
        return self._clock()

    async def add(
        self,
        delivery: Delivery,
        delay_secs: float,
        *,
        settle: bool = False,
        unknown_only: bool = False,
        share: int | None = None,
    ) -> Added:
        await trio.lowlevel.checkpoint()
        tenant = delivery.tenant
        kept = self._kept.get(delivery.response_id)
        if kept is None:
            if settle:
                return Added.GONE
            if len(self._kept) >= MAX_PENDING:
                return Added.FULL
            if share is not None and self._tenants[tenant] >= share:
                return Added.TENANT_FULL
        elif unknown_only and kept[1].status is not None:
            return Added.KNOWN
        else:
            self._forget(kept[1])
        self._kept[delivery.response_id] = (self._now() + delay_secs, delivery)
        self._tenants[tenant] += 1
        return Added.KEPT

    async def claim(
        self,
        limit: int,
        lease_secs: float,
        *,
        each: int | None = None,
        rooms: Mapping[str, int] | None = None,
    ) -> tuple[Delivery, ...]:
        await trio.lowlevel.checkpoint()
        now = self._now()
        due: dict[str, list[tuple[float, str]]] = {}
        for at, kept in self._kept.values():
            if at <= now:
                due.setdefault(kept.tenant, []).append((at, kept.response_id))
        for places in due.values():
            places.sort()
        taken: list[Delivery] = []
        for tenant in sorted(due, key=lambda t: (due[t][0][0], t)):
            room = room_of(tenant, each, rooms)
            left = limit - len(taken)
            for _, response_id in due[tenant][: max(0, left if room is None else min(room, left))]:
                delivery = self._kept[response_id][1]
                self._kept[response_id] = (now + lease_secs, delivery)
                taken.append(delivery)
        return tuple(taken)

    async def drop(self, response_id: str) -> bool:
        await trio.lowlevel.checkpoint()
        kept = self._kept.pop(response_id, None)
        if kept is None:
            return False
        self._forget(kept[1])
        return True

    def _forget(self, delivery: Delivery) -> None:
        self._tenants[delivery.tenant] -= 1
        if self._tenants[delivery.tenant] <= 0:
            del self._tenants[delivery.tenant]
