"""The store actor: the only owner of stored responses.

Entries are charged their approximate serialised JSON size against a byte budget, kept
in LRU order, and expire a fixed time after insertion; the clock is Trio's, so tests run
on the fake clock. The interface stays narrow (put, get, delete) so another backend can
sit behind it later.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
from typing import TypeVar

import trio
from cachetools import TTLCache

from mlxcel.actors.messages import DeleteResponse, GetResponse, PutResponse, StoreCommand
from mlxcel.config import StoreLimits
from mlxcel.items import ResponseRecord

log = logging.getLogger(__name__)

_NO_EXPIRY = float("inf")
T = TypeVar("T")


def approx_json_size(record: ResponseRecord) -> int:
    """Roughly the bytes the record takes as JSON; what the byte budget counts."""
    return len(json.dumps(dataclasses.asdict(record), default=str).encode())


class StoreHandle:
    def __init__(self, inbox: trio.MemorySendChannel[StoreCommand], limits: StoreLimits) -> None:
        self._inbox = inbox
        self.limits = limits

    async def put(self, record: ResponseRecord) -> bool:
        send, recv = trio.open_memory_channel[bool](1)
        await self._inbox.send(PutResponse(record, send))
        return await recv.receive()

    async def get(self, response_id: str) -> ResponseRecord | None:
        send, recv = trio.open_memory_channel[ResponseRecord | None](1)
        await self._inbox.send(GetResponse(response_id, send))
        return await recv.receive()

    async def delete(self, response_id: str) -> bool:
        send, recv = trio.open_memory_channel[bool](1)
        await self._inbox.send(DeleteResponse(response_id, send))
        return await recv.receive()


class StoreActor:
    def __init__(self, limits: StoreLimits) -> None:
        self._limits = limits
        ttl = limits.ttl_secs if limits.ttl_secs > 0 else _NO_EXPIRY
        self._responses: TTLCache[str, ResponseRecord] = TTLCache(
            maxsize=limits.max_bytes, ttl=ttl, timer=trio.current_time, getsizeof=approx_json_size
        )

    async def run(self, *, task_status: trio.TaskStatus[StoreHandle] = trio.TASK_STATUS_IGNORED) -> None:
        """Serve store commands until cancelled.

        Resource handling: the inbox is unbuffered; every command is answered at once
        on its own one-slot reply channel, so callers never queue behind each other long.

        Error handling: a caller that left before its reply gets none (the closed reply
        channel is ignored); nothing else raises here.
        """
        send, recv = trio.open_memory_channel[StoreCommand](0)
        task_status.started(StoreHandle(send, self._limits))
        async with recv:
            async for command in recv:
                self._handle(command)

    def _handle(self, command: StoreCommand) -> None:
        match command:
            case PutResponse(record, reply):
                _answer(reply, self._put(record))
            case GetResponse(response_id, reply):
                _answer(reply, self._responses.get(response_id))
            case DeleteResponse(response_id, reply):
                _answer(reply, self._responses.pop(response_id, None) is not None)

    def _put(self, record: ResponseRecord) -> bool:
        if not self._limits.enabled:
            return False
        self._responses.pop(record.id, None)  # replacing an id never double-counts
        try:
            self._responses[record.id] = record
        except ValueError:
            log.info("response %s is larger than the store's byte budget; not kept", record.id)
            return False
        while len(self._responses) > self._limits.max_entries:
            self._responses.popitem()
        return True


def _answer(reply: trio.MemorySendChannel[T], value: T) -> None:
    with contextlib.suppress(trio.BrokenResourceError, trio.ClosedResourceError):
        reply.send_nowait(value)
