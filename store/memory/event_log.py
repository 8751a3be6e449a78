"""The memory backend's event logs (`store/event_log.py`): in this process, on the
backend's clock, gone with the process.

Each operation runs to its end before its checkpoint (a shielded one), as the backend's
own do, so it is atomic under Trio; a deleted response leaves its table and its log in
the same step, through the backend's `remove`, which never checkpoints. Readers wait on a
doorbell: the jobs that append run in this process.
"""

from __future__ import annotations

import heapq
import math
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field

import trio

from mlxcel.store.event_log import Doorbell, EventLimits, LogSlice
from mlxcel.store.tables import Table, TableStatistics


@dataclass(slots=True)
class _Log:
    frames: list[bytes] = field(default_factory=list)
    count: int = 0
    size: int = 0
    ended: bool = False
    truncated: bool = False
    expires: float = math.inf


class MemoryEventLog:
    """`EventLog` in this process's memory, on the store's clock."""

    def __init__(
        self,
        limits: EventLimits,
        clock: Callable[[], float],
        remove: Callable[[Table, str], bool],
    ) -> None:
        self.limits = limits
        self._clock = clock
        self._remove = remove
        """Deletes a value from the backend's table without a checkpoint."""
        self._logs: dict[str, _Log] = {}
        self._ended: OrderedDict[str, None] = OrderedDict()
        """The ended logs, the longest ended first: the first dropped for room."""
        self._expiries: list[tuple[float, str]] = []
        """(expiry, id) of the ended logs that expire, soonest first (some already gone)."""
        self._bytes = 0
        self._bell = Doorbell()

    async def append(
        self, response_id: str, first: int, frames: tuple[bytes, ...], *, end_ttl: float | None
    ) -> bool:
        try:
            self._expire()
            log = self._logs.get(response_id)
            if log is None and first == 0:
                log = self._logs[response_id] = _Log()
            if log is None or log.ended or log.count != first:
                return False
            log.count += len(frames)
            kept = self._keep(response_id, log, frames)
            if end_ttl is not None:
                log.ended = True
                log.expires = self._clock() + end_ttl if end_ttl > 0 else math.inf
                self._ended[response_id] = None
                if end_ttl > 0:
                    heapq.heappush(self._expiries, (log.expires, response_id))
            self._bell.ring(response_id)
            return kept
        finally:
            await trio.lowlevel.cancel_shielded_checkpoint()

    async def read(self, response_id: str, after: int, limit: int) -> LogSlice | None:
        try:
            self._expire()
            log = self._logs.get(response_id)
            if log is None:
                return None
            start = max(after + 1, 0)
            frames = () if log.truncated else tuple(log.frames[start : start + limit])
            return LogSlice(frames, log.count, log.ended, log.truncated)
        finally:
            await trio.lowlevel.cancel_shielded_checkpoint()

    async def wait(self, response_id: str, after: int) -> None:
        log = self._logs.get(response_id)
        if log is not None and (log.count > after + 1 or log.ended):
            await trio.lowlevel.checkpoint()
            return
        await self._bell.wait(response_id)

    async def statistics(self) -> TableStatistics:
        self._expire()
        await trio.lowlevel.cancel_shielded_checkpoint()
        return TableStatistics(entries=len(self._logs), bytes=self._bytes)

    async def delete_response(self, response_id: str, tables: tuple[Table, ...]) -> bool:
        try:
            found = [self._remove(table, response_id) for table in tables]
            if response_id in self._logs:
                self._drop(response_id)
            self._bell.ring(response_id)  # a follower reads again and finds it gone
            return any(found)
        finally:
            await trio.lowlevel.cancel_shielded_checkpoint()

    def _keep(self, response_id: str, log: _Log, frames: tuple[bytes, ...]) -> bool:
        """Keep `frames` within the caps, dropping ended logs for room; or truncate."""
        if log.truncated:
            return False
        size = sum(len(f) for f in frames)
        while self._bytes + size > self.limits.max_bytes and self._ended:
            self._drop(next(iter(self._ended)))
        if log.count > self.limits.max_events or self._bytes + size > self.limits.max_bytes:
            self._bytes -= log.size
            log.frames, log.size, log.truncated = [], 0, True
            return False
        log.frames.extend(frames)
        log.size += size
        self._bytes += size
        return True

    def _expire(self) -> None:
        now = self._clock()
        while self._expiries and self._expiries[0][0] <= now:
            expires, response_id = heapq.heappop(self._expiries)
            log = self._logs.get(response_id)
            if log is not None and log.expires == expires:  # not a later log of that id
                self._drop(response_id)

    def _drop(self, response_id: str) -> None:
        log = self._logs.pop(response_id)
        self._ended.pop(response_id, None)
        self._bytes -= log.size
