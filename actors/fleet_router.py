"""The scheduler handle of a server with several models: each response goes to the
scheduler of the model it names (`record.model`), loaded first if need be, and holds that
model by a lease from its submission until its stream closes. The rest (cancel, drain,
end, statistics) asks every loaded model's scheduler. Routes and the job supervisor talk
to it as they talk to one scheduler."""

from __future__ import annotations

import trio

from mlxcel.actors.fleet import Fleet
from mlxcel.actors.messages import SchedulerCommand, SchedulerStatistics
from mlxcel.actors.response_stream import ResponseStream, SchedulerHandle, release
from mlxcel.generation import GenerationRequest
from mlxcel.items import ResponseRecord


class RoutedStream(ResponseStream):
    """A response stream whose scheduler is its model's, found when it is submitted."""

    def __init__(
        self, fleet: Fleet, key: str, request: GenerationRequest, *, waits: bool, depth: int
    ) -> None:
        # No scheduler until `submit`: this inbox has no reader, so whatever is sent
        # before (a queue position asked, a withdraw) meets a closed scheduler.
        unrouted, _ = trio.open_memory_channel[SchedulerCommand](0)
        super().__init__(unrouted, request, waits=waits, max_queue_depth=depth)
        self._fleet = fleet
        self._key = key
        self._held = False

    async def submit(self) -> None:
        """Wait for the model (its load, if it is not loaded), then queue the response
        on its scheduler; a load that fails is `ModelLoadFailed`."""
        try:
            engines = await self._fleet.acquire(self._key)
        except BaseException:
            await self.aclose()
            await release(self._request)
            raise
        self._held = True
        self._control = engines.scheduler.control
        await super().submit()

    async def aclose(self) -> None:
        try:
            await super().aclose()  # withdrawn from its scheduler first
        finally:
            if self._held:
                self._held = False
                self._fleet.release(self._key)


class FleetScheduler(SchedulerHandle):
    def __init__(self, fleet: Fleet, depth: int) -> None:
        unrouted, _ = trio.open_memory_channel[SchedulerCommand](0)
        super().__init__(unrouted, depth)
        self._fleet = fleet

    def stream(self, request: GenerationRequest, *, waits: bool = False) -> ResponseStream:
        key = self._fleet.find(request.record.echo.model)
        return RoutedStream(self._fleet, key, request, waits=waits, depth=self.max_queue_depth)

    async def cancel(self, response_id: str, *, tenant: str = "") -> ResponseRecord | None:
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
