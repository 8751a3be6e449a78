"""The scheduler: generation slots, the waiting queue, and the path of one response.

A control task owns admission. Free slots report `SlotIdle`; a submitted command goes
to an idle slot at once or waits in one FIFO line. Requests may wait only while fewer
than `--max-queue-depth` requests are waiting (else `QueueFull`: 503); background jobs
always wait their turn (the job cap bounds them). The control task also cancels queued
or running responses. A slot runs its response to the end: it opens a sequence in the
model actor, relays the model's tokens through a `ResponseBuilder` to the requester,
stores the final record, appends the turn to its conversation, and only then reports
the end.
"""

from __future__ import annotations

import contextlib
import logging
from collections import deque
from dataclasses import dataclass, field

import trio

from mlxcel.actors.echo import EchoHandle, turn_key
from mlxcel.actors.messages import (
    CancelResponse,
    Generate,
    GenerationRequest,
    KeepAlive,
    ResponseEvent,
    ResponseFinished,
    SchedulerCommand,
    SlotIdle,
    Submit,
)
from mlxcel.actors.responses import ResponseBuilder
from mlxcel.actors.store import StoreHandle
from mlxcel.errors import GenerationFailed, QueueFull
from mlxcel.items import Message, Reasoning, ResponseRecord
from mlxcel.model.actor import ModelHandle, SequenceFailed

log = logging.getLogger(__name__)


class SchedulerHandle:
    def __init__(self, control: trio.MemorySendChannel[SchedulerCommand], depth: int) -> None:
        self._control = control
        self.max_queue_depth = depth

    async def submit(self, command: Generate, *, waits: bool = False) -> None:
        """Queue a request, or raise `QueueFull` when every slot and queue place is taken.
        With `waits`, (a background job) the command is always queued."""
        send, recv = trio.open_memory_channel[bool](1)
        await self._control.send(Submit(command, waits, send))
        if not await recv.receive():
            raise QueueFull(
                "The server is busy: every generation slot is in use and the waiting "
                f"queue is full ({self.max_queue_depth}). Retry shortly.",
                code="server_overloaded",
            )

    async def generate(self, request: GenerationRequest, *, waits: bool = False) -> ResponseRecord:
        """Run a request to its end: its final record (the events on the way are dropped)."""
        send, recv = trio.open_memory_channel[ResponseEvent](0)
        await self.submit(Generate(request, send), waits=waits)
        async with recv:
            async for event in recv:
                if isinstance(event, ResponseFinished):
                    return event.record
        raise GenerationFailed("The response ended without a result.")

    async def cancel(self, response_id: str) -> ResponseRecord | None:
        """Cancel a queued or running response; its final record, or None if not held."""
        send, recv = trio.open_memory_channel[ResponseRecord | None](1)
        await self._control.send(CancelResponse(response_id, send))
        return await recv.receive()


@dataclass
class _Running:
    scope: trio.CancelScope
    waiters: list[trio.MemorySendChannel[ResponseRecord | None]] = field(default_factory=list)


@dataclass
class _Waiting:
    command: Generate
    waits: bool


class Scheduler:
    def __init__(
        self,
        model: ModelHandle,
        store: StoreHandle,
        echo: EchoHandle,
        *,
        parallel: int,
        max_queue_depth: int,
        keepalive_secs: float,
    ) -> None:
        self._model = model
        self._store = store
        self._echo = echo
        self._parallel = parallel
        self._depth = max_queue_depth
        self._keepalive = keepalive_secs
        # Owned by this actor's tasks (control and slots), all on the Trio thread.
        self._line: deque[_Waiting] = deque()  # bounded: depth requests + the job cap
        self._waiting_requests = 0
        self._idle: deque[trio.MemorySendChannel[Generate]] = deque()  # at most `parallel`
        self._running: dict[str, _Running] = {}

    async def run(
        self, *, task_status: trio.TaskStatus[SchedulerHandle] = trio.TASK_STATUS_IGNORED
    ) -> None:
        """Run `parallel` slots and the control task until cancelled.

        Resource handling: at most `max_queue_depth` requests wait (the rest get 503);
        waiting background jobs are bounded by the job supervisor's cap. Each slot holds
        one sequence in the model at a time, so the model never holds more than
        `parallel`. The control inbox is unbuffered and the control task never blocks.

        Error handling: a requester that leaves (closed reply channel) ends its response
        and frees the slot; an engine failure becomes a `failed` response; a cancel
        becomes a `cancelled` one. Anything else propagates: it is a bug, and the root
        nursery stops the server.
        """
        control_send, control_recv = trio.open_memory_channel[SchedulerCommand](0)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self._control, control_recv, nursery)
            for _ in range(self._parallel):
                # `start` returns once the slot is registered idle, so a queue depth of
                # 0 admits `parallel` requests from the first moment.
                await nursery.start(self._slot, control_send.clone())
            task_status.started(SchedulerHandle(control_send, self._depth))

    async def _control(
        self, inbox: trio.MemoryReceiveChannel[SchedulerCommand], nursery: trio.Nursery
    ) -> None:
        async with inbox:
            async for command in inbox:
                match command:
                    case Submit(generate, waits, reply):
                        reply.send_nowait(self._admit(generate, waits))
                    case SlotIdle(slot):
                        self._idle.append(slot)
                        self._dispatch()
                    case CancelResponse(response_id, reply):
                        self._cancel(response_id, reply, nursery)

    def _admit(self, command: Generate, waits: bool) -> bool:
        if not waits and not self._idle and self._waiting_requests >= self._depth:
            return False
        self._line.append(_Waiting(command, waits))
        self._waiting_requests += not waits
        self._dispatch()
        return True

    def _dispatch(self) -> None:
        while self._idle and self._line:
            waiting = self._line.popleft()
            self._waiting_requests -= not waiting.waits
            # The slot's inbox holds one command and the slot is idle: never blocks.
            self._idle.popleft().send_nowait(waiting.command)

    def _cancel(
        self,
        response_id: str,
        reply: trio.MemorySendChannel[ResponseRecord | None],
        nursery: trio.Nursery,
    ) -> None:
        if (running := self._running.get(response_id)) is not None:
            running.scope.cancel()
            running.waiters.append(reply)  # answered when the slot has stored the end
            return
        for waiting in self._line:
            if waiting.command.request.record.id == response_id:
                self._line.remove(waiting)
                self._waiting_requests -= not waiting.waits
                nursery.start_soon(self._end_queued, waiting.command, reply)
                return
        reply.send_nowait(None)

    async def _end_queued(
        self, command: Generate, waiter: trio.MemorySendChannel[ResponseRecord | None]
    ) -> None:
        """A response cancelled before a slot took it: store and report it cancelled."""
        record = ResponseBuilder(command.request.record, len(command.request.prompt)).cancel()
        if record.echo.store and not record.echo.background:
            await self._store.put(record)
        waiter.send_nowait(record)
        async with command.reply:
            with contextlib.suppress(trio.BrokenResourceError, trio.ClosedResourceError):
                await command.reply.send(ResponseFinished(record))

    async def _slot(
        self,
        control: trio.MemorySendChannel[SchedulerCommand],
        *,
        task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
    ) -> None:
        # One command at a time: the control task hands one over only while we are idle.
        inbox_send, inbox = trio.open_memory_channel[Generate](1)
        async with control, inbox:
            await control.send(SlotIdle(inbox_send))
            task_status.started()
            async for command in inbox:
                async with command.reply:
                    await self._run(command)
                await control.send(SlotIdle(inbox_send))

    async def _run(self, command: Generate) -> None:
        request = command.request
        builder = ResponseBuilder(
            request.record,
            len(request.prompt),
            request.tools,
            reasoning_opened=request.reasoning_opened,
            compaction=request.compaction,
        )
        running = _Running(trio.CancelScope())
        self._running[request.record.id] = running
        record: ResponseRecord | None = None
        try:
            with running.scope:
                record = await self._generate(command, builder)
            if running.scope.cancelled_caught:
                record = builder.cancel()
                await self._end(command, [], record)
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
            if record.echo.store and not record.echo.background:  # jobs store their own end
                await self._store.put(record)
            conversation = record.echo.conversation_id
            if conversation is not None and record.status in ("completed", "incomplete"):
                await self._store.append(conversation, record.input_items + record.output)
            await self._remember_reasoning(command.request, record)
        # A requester gone at the very end changes nothing: the record is kept.
        with contextlib.suppress(trio.BrokenResourceError, trio.ClosedResourceError):
            await _send_all(command.reply, [*events, ResponseFinished(record)])
        return record

    async def _remember_reasoning(self, request: GenerationRequest, record: ResponseRecord) -> None:
        """An ordinary reply (reasoning, then a message; no tool calls) is remembered."""
        if request.echo_prefix is None or record.status != "completed":
            return
        match record.output:
            case (Reasoning(text=trace), Message() as message) if trace.strip():
                await self._echo.remember(turn_key(request.echo_prefix, message.text), trace)


async def _send_all(
    reply: trio.MemorySendChannel[ResponseEvent], events: list[ResponseEvent]
) -> None:
    for event in events:
        await reply.send(event)
