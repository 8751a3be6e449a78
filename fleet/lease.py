"""A request's lease on its model: taken once, before its preparation, and held until
the last of its work ends.

The fleet (`fleet/registry.py`) unloads a model only once no lease holds it, and new work
for a model being unloaded waits for its reload. So nothing that holds a lease may ever
wait for another one: the unload would wait for the holder and the holder for the
unload. A request therefore takes one lease (`Fleet.open_model`) and submits through it
(`ModelLease.stream`, `ModelLease.generate`) to the scheduler of the very model it
holds. Work that outlives the route (a streamed response until its stream closes, a
background job until it ends) shares the same lease (`share`), which never waits: the
model is returned to the fleet when the last holder ends its share.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from types import TracebackType

from mlxcel.actors.messages import Generate
from mlxcel.actors.response_stream import ResponseStream, final_record
from mlxcel.fleet.engines import Engines
from mlxcel.generation import GenerationRequest, ServedModel
from mlxcel.items import ResponseRecord


@dataclass
class _Lease:
    """One lease of the fleet's, and how many hold it."""

    key: str
    engines: Engines
    give_back: Callable[[], None]
    holders: int = 1


class ModelLease:
    """One holder of a request's lease on a loaded model: the model's key and engines,
    and the way to submit work to them. An async context manager: leaving it ends this
    holder's share."""

    def __init__(self, lease: _Lease) -> None:
        self._lease = lease
        self._ended = False

    @classmethod
    def taken(cls, key: str, engines: Engines, give_back: Callable[[], None]) -> ModelLease:
        """The first holder of a lease just taken; `give_back` returns it once the last
        holder has ended its share."""
        return cls(_Lease(key, engines, give_back))

    @property
    def key(self) -> str:
        """The model's name in the fleet (its alias)."""
        return self._lease.key

    @property
    def engines(self) -> Engines:
        return self._lease.engines

    def served(self) -> ServedModel:
        """The model as preparation takes it."""
        return self._lease.engines.served()

    def share(self) -> ModelLease:
        """Another holder of this lease, for work that may outlive this holder; never
        waits. Only a holder that has not ended may share."""
        if self._ended:
            raise RuntimeError(f"the lease of {self.key!r} is shared after its end")
        self._lease.holders += 1
        return ModelLease(self._lease)

    def end(self) -> None:
        """End this holder's share (again: nothing); the last one returns the lease."""
        if self._ended:
            return
        self._ended = True
        self._lease.holders -= 1
        if self._lease.holders == 0:
            self._lease.give_back()

    def stream(self, request: GenerationRequest, *, waits: bool = False) -> ResponseStream:
        """A stream for `request` on this model's scheduler, owned by the caller; once
        submitted, it holds the lease until it closes."""
        return LeasedStream(self, request, waits=waits)

    async def generate(self, request: GenerationRequest) -> ResponseRecord:
        """Run `request` on this model to its end: its final record."""
        async with self.stream(request) as events:
            await events.submit()
            return await final_record(events)

    async def __aenter__(self) -> ModelLease:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.end()


class LeasedStream(ResponseStream):
    """A response stream on its lease's model: a share of the lease from its
    submission until it closes (a streamed response outlives its route)."""

    def __init__(self, lease: ModelLease, request: GenerationRequest, *, waits: bool) -> None:
        scheduler = lease.engines.scheduler
        super().__init__(
            scheduler.control, request, waits=waits, max_queue_depth=scheduler.max_queue_depth
        )
        self._lease = lease
        self._held: ModelLease | None = None

    def _command(self) -> Generate:
        if self._held is None:
            self._held = self._lease.share()
        return super()._command()

    async def aclose(self) -> None:
        try:
            await super().aclose()  # withdrawn from its scheduler first
        finally:
            if self._held is not None:
                self._held.end()
