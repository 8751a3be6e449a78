"""The webhook sender's attempts in flight, counted by tenant (an API key) and by target
(a URL), and how many more each may start: a receiver that hangs holds only its own
lanes, never another tenant's or another URL's.

A claim (`store/deliveries.py`) takes at most `each` of any tenant and, of the tenants
`rooms` names, only their room, so the store hands the sender only what it may start.
The store does not know targets (a tenant's is looked up when it is sent, and several
tenants may share one: the server's `--webhook-url`), so a delivery claimed for a target
that is at its bound is not started: `take` refuses it, the sender puts it back, and its
tenant is named in `rooms` (with no room) until its target has room again.
"""

from __future__ import annotations

from collections import Counter

PER_TENANT = 8
"""Attempts at once for one tenant's deliveries: a tenant whose receiver hangs holds this
many, each for at most one attempt's timeout, and no more."""
PER_TARGET = 16
"""Attempts at once to one URL: twice a tenant's, so on a receiver several tenants share
(the server's own) one tenant never takes the whole lane."""
IN_FLIGHT = 64
"""Attempts at once in all: the sender's tasks and the HTTP client's connections."""


class Lanes:
    """Counts of attempts in flight; owned by one sender, used from its Trio thread only."""

    def __init__(
        self, per_tenant: int = PER_TENANT, per_target: int = PER_TARGET, total: int = IN_FLIGHT
    ) -> None:
        self.each = per_tenant
        self._per_target = per_target
        self._total = total
        self._flying = 0
        self._tenants: Counter[str] = Counter()
        self._targets: Counter[str] = Counter()
        self._target_of: dict[str, str] = {}
        """The target last seen for each tenant with attempts in flight or whose target
        had no room for it; one is forgotten once neither holds (at most one entry per
        tenant with deliveries)."""

    @property
    def free(self) -> int:
        """How many more attempts may start, whatever their tenant."""
        return self._total - self._flying

    def rooms(self) -> dict[str, int]:
        """The room of each tenant with less than `each` left (0 for one whose target is
        at its bound); every other tenant may start `each`."""
        rooms = {}
        for tenant, target in list(self._target_of.items()):
            room = self._room(tenant, target)
            if room < self.each:
                rooms[tenant] = room
            elif not self._tenants[tenant]:
                del self._target_of[tenant]
        return rooms

    def take(self, tenant: str, target: str) -> bool:
        """Count one attempt of `tenant` at `target`; False (nothing counted) when either,
        or the sender, is at its bound."""
        self._target_of[tenant] = target
        if self.free <= 0 or self._room(tenant, target) <= 0:
            return False
        self._flying += 1
        self._tenants[tenant] += 1
        self._targets[target] += 1
        return True

    def give(self, tenant: str, target: str) -> None:
        """One attempt `take` counted has ended."""
        self._flying -= 1
        for counts, key in ((self._tenants, tenant), (self._targets, target)):
            counts[key] -= 1
            if counts[key] <= 0:
                del counts[key]
        latest = self._target_of.get(tenant, target)
        if not self._tenants[tenant] and self._room(tenant, latest) >= self.each:
            self._target_of.pop(tenant, None)

    def _room(self, tenant: str, target: str) -> int:
        tenant_room = self.each - self._tenants[tenant]
        return max(0, min(tenant_room, self._per_target - self._targets[target]))
