"""The scheduler: generation slots, the waiting queue, and the path of one response.

`--parallel` slot tasks pull `Generate` commands from one inbox whose buffer is the
waiting queue (`--max-queue-depth`): `submit_nowait` either hands the command to an idle
slot, queues it, or raises `QueueFull` (503). A slot runs its response to the end: it
opens a sequence in the model actor, relays the model's tokens through a
`ResponseBuilder` to the requester, stores the final record, then reports it.
"""

from __future__ import annotations

import logging

import trio

from mlxcel.actors.messages import Generate, KeepAlive, ResponseEvent, ResponseFinished
from mlxcel.actors.responses import ResponseBuilder
from mlxcel.actors.store import StoreHandle
from mlxcel.errors import QueueFull
from mlxcel.items import ResponseRecord
from mlxcel.model.actor import ModelHandle, SequenceFailed

log = logging.getLogger(__name__)


class SchedulerHandle:
    def __init__(self, inbox: trio.MemorySendChannel[Generate], depth: int) -> None:
        self._inbox = inbox
        self.max_queue_depth = depth

    def submit_nowait(self, command: Generate) -> None:
        """Queue a request, or raise `QueueFull` when every slot and queue place is taken."""
        try:
            self._inbox.send_nowait(command)
        except trio.WouldBlock:
            raise QueueFull(
                "The server is busy: every generation slot is in use and the waiting "
                f"queue is full ({self.max_queue_depth}). Retry shortly.",
                code="server_overloaded",
            ) from None


class Scheduler:
    def __init__(
        self,
        model: ModelHandle,
        store: StoreHandle,
        *,
        parallel: int,
        max_queue_depth: int,
        keepalive_secs: float,
    ) -> None:
        self._model = model
        self._store = store
        self._parallel = parallel
        self._depth = max_queue_depth
        self._keepalive = keepalive_secs

    async def run(
        self, *, task_status: trio.TaskStatus[SchedulerHandle] = trio.TASK_STATUS_IGNORED
    ) -> None:
        """Run `parallel` slots until cancelled.

        Resource handling: the inbox buffer is the waiting queue, bounded by
        `max_queue_depth`; each slot holds one sequence in the model at a time, so the
        model never holds more than `parallel`.

        Error handling: a requester that leaves (closed reply channel) ends its response
        and frees the slot; an engine failure becomes a `failed` response. Anything
        else propagates: it is a bug, and the root nursery stops the server.
        """
        send, recv = trio.open_memory_channel[Generate](self._depth)
        async with trio.open_nursery() as nursery:
            for _ in range(self._parallel):
                # `start` returns once the slot waits on the inbox, so a queue depth of
                # 0 still admits `parallel` requests from the first moment.
                await nursery.start(self._slot, recv.clone())
            recv.close()
            task_status.started(SchedulerHandle(send, self._depth))

    async def _slot(
        self,
        inbox: trio.MemoryReceiveChannel[Generate],
        *,
        task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
    ) -> None:
        task_status.started()
        async with inbox:
            async for command in inbox:
                async with command.reply:
                    try:
                        await self._generate(command)
                    except (trio.BrokenResourceError, trio.ClosedResourceError):
                        log.info("client left %s; its sequence is stopped",
                                 command.request.record.id)

    async def _generate(self, command: Generate) -> None:
        request, reply = command.request, command.reply
        builder = ResponseBuilder(request.record, len(request.prompt))
        for event in builder.start():
            await reply.send(event)
        async with self._model.open_sequence(list(request.prompt), request.sampling) as tokens:
            while True:
                with trio.move_on_after(self._keepalive) as idle:
                    try:
                        step = await tokens.receive()
                    except trio.EndOfChannel:
                        break
                if idle.cancelled_caught:
                    await reply.send(KeepAlive())
                    continue
                if isinstance(step, SequenceFailed):
                    events, record = builder.fail("server_error", step.message)
                    await self._finish(reply, events, record)
                    return
                await _send_all(reply, builder.feed(step))
                if step.finish is not None:
                    events, record = builder.finish(step.finish)
                    await self._finish(reply, events, record)
                    return
        # The channel ended without a finishing step: the engine dropped the sequence.
        events, record = builder.fail("server_error", "the engine dropped the sequence")
        await self._finish(reply, events, record)

    async def _finish(
        self,
        reply: trio.MemorySendChannel[ResponseEvent],
        events: list[ResponseEvent],
        record: ResponseRecord,
    ) -> None:
        await _send_all(reply, events)
        if record.echo.store:
            await self._store.put(record)  # stored before the client can see the end
        await reply.send(ResponseFinished(record))


async def _send_all(reply: trio.MemorySendChannel[ResponseEvent], events: list[ResponseEvent]) -> None:
    for event in events:
        await reply.send(event)

