"""One replica among several that share a store (`--store redis://...`).

Each server process is a replica: it holds a lease in the shared store, renewed every
third of `--replica-lease-secs`, under an epoch new at each start. The jobs it runs are
registered under that owner (replica, epoch). Each renewal also reaps: a job whose
owner's lease is gone (the process died, or was paused past its lease) is ended `failed`
(or `cancelled` when a cancel was asked) by whichever replica gets there first, exactly
once. A replica that finds its own lease lost takes a new epoch and gives up the jobs of
the old one (their late writes are fenced out by the store); `Membership.lost` tells the
job supervisor when. A cancel asked on another replica reaches the owner twice over: a
message on its channel at once, and the durable flag it re-reads every renewal.
"""

from __future__ import annotations

import contextlib
import logging
import uuid
from collections.abc import AsyncIterator
from typing import Protocol

import trio

from mlxcel.errors import StoreUnavailable
from mlxcel.store.backend import JobOwner

log = logging.getLogger(__name__)

LEASE_LOST_MESSAGE = (
    "The server running this response lost its lease on the shared store before it finished."
)


class SharedStore(Protocol):
    """What a backend that several replicas share adds to `StoreBackend`."""

    async def hold_lease(self, owner: JobOwner, lease_secs: float, *, take: bool) -> bool: ...

    async def release_lease(self, owner: JobOwner) -> None: ...

    async def cancels_for(self, owner: JobOwner) -> tuple[str, ...]: ...

    def cancel_requests(
        self, replica: str
    ) -> contextlib.AbstractAsyncContextManager[AsyncIterator[str]]: ...

    async def reap(self, owner: JobOwner) -> int: ...


def new_epoch() -> str:
    return uuid.uuid4().hex


class Membership:
    """This process's lease and job-owner identity in a shared store."""

    def __init__(self, shared: SharedStore, replica: str, lease_secs: float) -> None:
        self._shared = shared
        self.lease_secs = lease_secs
        self.owner = JobOwner(replica, new_epoch())
        """Who new jobs are registered under: a new epoch after a lost lease."""
        self._lost = trio.Event()
        self._held = False

    async def join(self) -> None:
        """Take the lease (at start, before anything is registered)."""
        self._held = await self._shared.hold_lease(self.owner, self.lease_secs, take=True)

    async def leave(self) -> None:
        """Give the lease up (a clean stop, once every job's end is stored), so peers do
        not wait for it to expire."""
        with contextlib.suppress(StoreUnavailable, trio.ClosedResourceError):
            await self._shared.release_lease(self.owner)

    async def current(self) -> JobOwner:
        """The owner to register a new job under, its lease renewed just now. A lease
        lost while this process could not renew it (frozen past it) is found here,
        before a job is registered under it for peers to reap, and a new one is taken at
        once. StoreUnavailable when the store cannot be reached."""
        owner = self.owner
        if self._held and await self._shared.hold_lease(owner, self.lease_secs, take=False):
            return owner
        self._lose(owner, "it expired or was taken")
        await self._take()
        return self.owner

    async def lost(self, owner: JobOwner) -> None:
        """Return once `owner` no longer holds the lease (at once if it is not current)."""
        while owner == self.owner:
            await self._lost.wait()

    def cancel_requests(self) -> contextlib.AbstractAsyncContextManager[AsyncIterator[str]]:
        """The ids of this replica's jobs asked to cancel elsewhere, as they are asked."""
        return self._shared.cancel_requests(self.owner.replica)

    async def cancels_asked(self) -> tuple[str, ...]:
        """The ids of the current owner's jobs flagged to cancel."""
        return await self._shared.cancels_for(self.owner)

    async def keep(self) -> None:
        """Renew the lease and reap dead owners' jobs every third of the lease, until
        cancelled. Never raises but Cancelled: a store outage is logged and retried."""
        period = self.lease_secs / 3
        renewed_at = trio.current_time()
        while True:
            await trio.sleep(period)
            try:
                owner = self.owner
                if self._held and not await self._shared.hold_lease(
                    owner, self.lease_secs, take=False
                ):
                    self._lose(owner, "it expired or was taken")
                await self._take()  # at once: a new job must not wait unleased for peers
                renewed_at = trio.current_time()
                ended = await self._shared.reap(self.owner)
                if ended:
                    log.warning("ended %d background responses of replicas that stopped", ended)
            except StoreUnavailable:
                if self._held and trio.current_time() - renewed_at >= self.lease_secs:
                    self._lose(self.owner, "the store could not be reached for a whole lease")

    async def _take(self) -> None:
        """Take the current owner's lease unless it is held."""
        if not self._held:
            owner = self.owner
            taken = await self._shared.hold_lease(owner, self.lease_secs, take=True)
            if owner == self.owner:  # not lost meanwhile
                self._held = taken

    def _lose(self, owner: JobOwner, why: str) -> None:
        """`owner`'s lease is gone: a new epoch, its lease not yet taken (nothing if
        `owner` is no longer current: another task found the loss first)."""
        if owner != self.owner or not self._held:
            return
        log.warning(
            "replica %s lost its lease (%s); its running background responses are given up",
            self.owner.replica,
            why,
        )
        self.owner = JobOwner(self.owner.replica, new_epoch())
        self._held = False
        lost, self._lost = self._lost, trio.Event()
        lost.set()
