"""What a server with several models does across all of them: cancel a response
wherever it runs, drain and end every loaded model's work, and add up their statistics.
A response itself goes to its model through its request's lease
(`fleet/lease.py`), never through here."""

from __future__ import annotations

import trio

from mlxcel.actors.messages import SchedulerStatistics
from mlxcel.fleet.registry import Fleet
from mlxcel.items import ResponseRecord


class FleetScheduler:
    """Every loaded model's scheduler, asked as one."""

    def __init__(self, fleet: Fleet) -> None:
        self._fleet = fleet

    async def cancel(self, response_id: str, *, tenant: str = "") -> ResponseRecord | None:
        """Cancel a queued or running response of `tenant` on whichever model has it;
        its final record, or None if none holds it."""
        for engines in self._fleet.loaded():
            found = await engines.scheduler.cancel(response_id, tenant=tenant)
            if found is not None:
                return found
        return None

    async def drain(self) -> None:
        """No model loads from now on; every loaded one refuses new work and drains."""
        self._fleet.close()
        async with trio.open_nursery() as nursery:
            for engines in self._fleet.loaded():
                nursery.start_soon(engines.scheduler.drain)

    async def end_all(self) -> None:
        async with trio.open_nursery() as nursery:
            for engines in self._fleet.loaded():
                nursery.start_soon(engines.scheduler.end_all)

    async def statistics(self) -> SchedulerStatistics:
        """Every loaded model's slots and waiting line added up."""
        slots = busy = queued = 0
        for engines in self._fleet.loaded():
            one = await engines.scheduler.statistics()
            slots, busy, queued = slots + one.slots, busy + one.busy, queued + one.queued
        return SchedulerStatistics(slots, busy, queued)
