"""The scheduler: generation slots, the waiting queue, and the path of one response.

`--parallel` slot tasks pull `Generate` commands from one queue whose buffer is the
waiting queue (`--max-queue-depth`); a control task admits submissions (or answers that
the queue is full: 503) and cancels queued or running responses. A slot runs its response
to the end: it opens a sequence in the model actor, relays the model's tokens through a
`ResponseBuilder` to the requester, stores the final record, appends the turn to its
conversation, and only then reports the end.
"""

from __future__ import annotations

import contextlib
import logging
from dataclasses import dataclass, field

import trio

from mlxcel.actors.messages import (
    CancelResponse,
    Generate,
    KeepAlive,
    ResponseEvent,
    ResponseFinished,
    SchedulerCommand,
    Submit,
)
from mlxcel.actors.responses import ResponseBuilder
from mlxcel.actors.store import StoreHandle
from mlxcel.errors import QueueFull
from mlxcel.items import ResponseRecord
from mlxcel.model.actor import ModelHandle, SequenceFailed

log = logging.getLogger(__name__)


class SchedulerHandle:
    def __init__(self, control: trio.MemorySendChannel[SchedulerCommand], depth: int) -> None:
        self._control = control
        self.max_queue_depth = depth

    async def submit(self, command: Generate) -> None:
        """Queue a request, or raise `QueueFull` when every slot and queue place is taken."""
        send, recv = trio.open_memory_channel[bool](1)
        await self._control.send(Submit(command, send))
        if not await recv.receive():
            raise QueueFull(
                "The server is busy: every generation slot is in use and the waiting "
                f"queue is full ({self.max_queue_depth}). Retry shortly.",
                code="server_overloaded",
            )

    async def cancel(self, response_id: str) -> ResponseRecord | None:
        """Cancel a queued or running response; its final record, or None if not held."""
        send, recv = trio.open_memory_channel[ResponseRecord | None](1)
        await self._control.send(CancelResponse(response_id, send))
        return await recv.receive()


@dataclass
class _Running:
    scope: trio.CancelScope
    waiters: list[trio.MemorySendChannel[ResponseRecord | None]] = field(default_factory=list)


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
        # Owned by this actor's tasks (control and slots), all on the Trio thread.
        self._queued: dict[str, Generate] = {}
        self._cancelled_while_queued: set[str] = set()
        self._running: dict[str, _Running] = {}

    async def run(
        self, *, task_status: trio.TaskStatus[SchedulerHandle] = trio.TASK_STATUS_IGNORED
    ) -> None:
        """Run `parallel` slots and the control task until cancelled.

        Resource handling: the queue buffer is the waiting queue, bounded by
        `max_queue_depth`; each slot holds one sequence in the model at a time, so the
        model never holds more than `parallel`. The control inbox is unbuffered.

        Error handling: a requester that leaves (closed reply channel) ends its response
        and frees the slot; an engine failure becomes a `failed` response; a cancel
        becomes a `cancelled` one. Anything else propagates: it is a bug, and the root
        nursery stops the server.
        """
        queue_send, queue_recv = trio.open_memory_channel[Generate](self._depth)
        control_send, control_recv = trio.open_memory_channel[SchedulerCommand](0)
        async with trio.open_nursery() as nursery:
            for _ in range(self._parallel):
                # `start` returns once the slot waits on the queue, so a queue depth of
                # 0 still admits `parallel` requests from the first moment.
                await nursery.start(self._slot, queue_recv.clone())
            queue_recv.close()
            nursery.start_soon(self._control, control_recv, queue_send, nursery)
            task_status.started(SchedulerHandle(control_send, self._depth))

    async def _control(
        self,
        inbox: trio.MemoryReceiveChannel[SchedulerCommand],
        queue: trio.MemorySendChannel[Generate],
        nursery: trio.Nursery,
    ) -> None:
        async with inbox, queue:
            async for command in inbox:
                match command:
                    case Submit(generate, reply):
                        reply.send_nowait(self._admit(queue, generate))
                    case CancelResponse(response_id, reply):
                        self._cancel(response_id, reply, nursery)

    def _admit(self, queue: trio.MemorySendChannel[Generate], command: Generate) -> bool:
        try:
            queue.send_nowait(command)
        except trio.WouldBlock:
            return False
        self._queued[command.request.record.id] = command
        return True

    def _cancel(
        self,
        response_id: str,
        reply: trio.MemorySendChannel[ResponseRecord | None],
        nursery: trio.Nursery,
    ) -> None:
        if (running := self._running.get(response_id)) is not None:
            running.scope.cancel()
            running.waiters.append(reply)  # answered when the slot has stored the end
        elif (queued := self._queued.pop(response_id, None)) is not None:
            self._cancelled_while_queued.add(response_id)
            nursery.start_soon(self._end_queued, queued, reply)
        else:
            reply.send_nowait(None)

    async def _end_queued(
        self, command: Generate, waiter: trio.MemorySendChannel[ResponseRecord | None]
    ) -> None:
        """A response cancelled before a slot took it: store and report it cancelled."""
        record = ResponseBuilder(command.request.record, len(command.request.prompt)).cancel()
        if record.echo.store:
            await self._store.put(record)
        waiter.send_nowait(record)
        async with command.reply:
            with contextlib.suppress(trio.BrokenResourceError, trio.ClosedResourceError):
                await command.reply.send(ResponseFinished(record))

    async def _slot(
        self,
        queue: trio.MemoryReceiveChannel[Generate],
        *,
        task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
    ) -> None:
        task_status.started()
        async with queue:
            async for command in queue:
                response_id = command.request.record.id
                if response_id in self._cancelled_while_queued:
                    self._cancelled_while_queued.discard(response_id)
                    continue  # `_end_queued` answered it
                del self._queued[response_id]
                async with command.reply:
                    await self._run(command)

    async def _run(self, command: Generate) -> None:
        request = command.request
        builder = ResponseBuilder(request.record, len(request.prompt))
        running = _Running(trio.CancelScope())
        self._running[request.record.id] = running
        record: ResponseRecord | None = None
        try:
            with running.scope:
                record = await self._generate(command, builder)
            if running.scope.cancelled_caught:
                record = await self._end(command, [], builder.cancel())
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            log.info("client left %s; its sequence is stopped", request.record.id)
        finally:
            del self._running[request.record.id]
            for waiter in running.waiters:
                waiter.send_nowait(record)

    async def _generate(self, command: Generate, builder: ResponseBuilder) -> ResponseRecord:
        request, reply = command.request, command.reply
        await _send_all(reply, builder.start())
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
                    return await self._end(command, *builder.fail("server_error", step.message))
                await _send_all(reply, builder.feed(step))
                if step.finish is not None:
                    return await self._end(command, *builder.finish(step.finish))
        # The channel ended without a finishing step: the engine dropped the sequence.
        return await self._end(command, *builder.fail("server_error", "the sequence was dropped"))

    async def _end(
        self, command: Generate, events: list[ResponseEvent], record: ResponseRecord
    ) -> ResponseRecord:
        """Store the end (and the conversation turn) before the requester can see it."""
        with trio.CancelScope(shield=True):  # a cancel must not interrupt storing its result
            if record.echo.store:
                await self._store.put(record)
            conversation = record.echo.conversation_id
            if conversation is not None and record.status in ("completed", "incomplete"):
                await self._store.append(conversation, record.input_items + record.output)
        await _send_all(command.reply, [*events, ResponseFinished(record)])
        return record


async def _send_all(
    reply: trio.MemorySendChannel[ResponseEvent], events: list[ResponseEvent]
) -> None:
    for event in events:
        await reply.send(event)
