"""The scheduler: generation slots and the waiting queue.

A control task owns admission. Free slots report `SlotIdle`; a submitted command goes
to an idle slot at once or waits in one FIFO line. Requests may wait only while fewer
than `--max-queue-depth` requests are waiting (else `QueueFull`: 503); background jobs
always wait their turn (the job cap bounds them). The control task also cancels and
withdraws queued or running responses, and ends them all at shutdown. What a slot does
with the response it takes is `actors/slot.py`.
"""

from __future__ import annotations

import logging
from collections import deque
from dataclasses import dataclass

import trio

from mlxcel.actors.messages import (
    Admission,
    CancelResponse,
    Drain,
    EndAll,
    Generate,
    ReadQueuePosition,
    ReadSchedulerStatistics,
    SchedulerCommand,
    SchedulerStatistics,
    SlotIdle,
    Submit,
    Withdraw,
    answer,
)
from mlxcel.actors.response_stream import SchedulerHandle
from mlxcel.actors.slot import ClientGone, ResponsePath, Running
from mlxcel.items import ResponseRecord
from mlxcel.metrics import Metrics
from mlxcel.model.actor import ModelHandle
from mlxcel.store import EchoHandle, StoreHandle

__all__ = ["ClientGone", "Scheduler", "SchedulerHandle"]

log = logging.getLogger(__name__)


@dataclass
class _Waiting:
    command: Generate
    waits: bool


class Scheduler:
    """The generation-slot scheduler: the bounded waiting line in front of a fixed number of
    slots, admission (a clean 503 when full), cancels and withdrawals, and the drain.
    It exists so that concurrency is bounded in one place and every request is answered."""

    def __init__(
        self,
        model: ModelHandle,
        store: StoreHandle,
        echo: EchoHandle,
        *,
        parallel: int,
        max_queue_depth: int,
        keepalive_secs: float,
        send_timeout_secs: float,
        metrics: Metrics | None = None,
    ) -> None:
        self._path = ResponsePath(
            model,
            store,
            echo,
            keepalive_secs=keepalive_secs,
            send_timeout_secs=send_timeout_secs,
            metrics=metrics or Metrics().for_model(""),
        )
        self._parallel = parallel
        self._depth = max_queue_depth
        # Owned by this actor's tasks (control and slots), all on the Trio thread.
        self._line: deque[_Waiting] = deque()  # bounded: depth requests + the job cap
        self._waiting_requests = 0
        self._idle: deque[trio.MemorySendChannel[Generate]] = deque()  # at most `parallel`
        self._running: dict[str, Running] = {}
        self._idle_waiters: list[trio.MemorySendChannel[None]] = []
        self._closed = False  # draining: every submission is refused

    async def run(
        self, *, task_status: trio.TaskStatus[SchedulerHandle] = trio.TASK_STATUS_IGNORED
    ) -> None:
        """Run `parallel` slots and the control task until cancelled.

        Resource handling: at most `max_queue_depth` requests wait (the rest get 503);
        waiting background jobs are bounded by the job supervisor's cap. Each slot holds
        one sequence in the model at a time, so the model never holds more than
        `parallel`. The control inbox is unbuffered and the control task never blocks.
        A slot waits on a requester for at most the send deadline: a reader that stops
        reading is treated as gone.

        Error handling: a requester that leaves (withdraws, closes its channel, misses
        the send deadline) ends its response and frees the slot; an engine failure, or
        any exception while building one response (a parser, a grammar, the builder),
        becomes a `failed` response for that request alone, logged with its traceback;
        a cancel becomes a `cancelled` one. Nothing one request does stops the server.
        """
        control_send, control_recv = trio.open_memory_channel[SchedulerCommand](0)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self._control, control_recv, nursery)
            for _ in range(self._parallel):
                # `start` returns once the slot is registered idle, so a queue depth of
                # 0 admits `parallel` requests from the first moment.
                await nursery.start(self._slot, control_send.clone())
            task_status.started(SchedulerHandle(control_send, self._depth))

    # --- control task ------------------------------------------------------------------

    async def _control(
        self, inbox: trio.MemoryReceiveChannel[SchedulerCommand], nursery: trio.Nursery
    ) -> None:
        async with inbox:
            async for command in inbox:
                match command:
                    case Submit(commands, waits, reply):
                        answer(reply, self._admit(commands, waits))
                    case SlotIdle(slot):
                        self._idle.append(slot)
                        self._dispatch()
                    case CancelResponse(response_id, reply, tenant):
                        self._cancel(response_id, reply, tenant, nursery)
                    case Withdraw(response_id):
                        self._withdraw(response_id, nursery)
                    case Drain(reply):
                        self._closed = True
                        self._idle_waiters.append(reply)
                    case EndAll(reply):
                        self._end_all(nursery)
                        self._idle_waiters.append(reply)
                    case ReadSchedulerStatistics(reply):
                        busy = self._parallel - len(self._idle)
                        answer(reply, SchedulerStatistics(self._parallel, busy, len(self._line)))
                    case ReadQueuePosition(response_id, reply):
                        answer(reply, self._position(response_id))
                self._wake_idle_waiters()

    def _admit(self, commands: tuple[Generate, ...], waits: bool) -> Admission:
        """All of `commands` into the line, or none. Requests fit only if the idle slots
        and the line's free places take every one of them at once (the line holds
        requests only while no slot is idle, so the two never overlap)."""
        if self._closed:
            return Admission.CLOSED
        room = len(self._idle) + self._depth - self._waiting_requests
        if not waits and len(commands) > room:
            return Admission.FULL
        for command in commands:
            self._line.append(_Waiting(command, waits))
            self._waiting_requests += not waits
        self._dispatch()
        return Admission.ADMITTED

    def _dispatch(self) -> None:
        while self._idle and self._line:
            waiting = self._line.popleft()
            self._waiting_requests -= not waiting.waits
            # The slot's inbox holds one command and the slot is idle: never blocks.
            self._idle.popleft().send_nowait(waiting.command)

    def _held_for_other(self, response_id: str, tenant: str) -> bool:
        """Whether the response is queued or running for a tenant other than `tenant`."""
        if (running := self._running.get(response_id)) is not None:
            return running.request.record.tenant != tenant
        for waiting in self._line:
            if waiting.command.request.record.id == response_id:
                return waiting.command.request.record.tenant != tenant
        return False

    def _unqueue(self, response_id: str) -> _Waiting | None:
        for waiting in self._line:
            if waiting.command.request.record.id == response_id:
                self._line.remove(waiting)
                self._waiting_requests -= not waiting.waits
                return waiting
        return None

    def _position(self, response_id: str) -> int | None:
        for place, waiting in enumerate(self._line, start=1):
            if waiting.command.request.record.id == response_id:
                return place
        return None

    def _cancel(
        self,
        response_id: str,
        reply: trio.MemorySendChannel[ResponseRecord | None],
        tenant: str,
        nursery: trio.Nursery,
    ) -> None:
        if self._held_for_other(response_id, tenant):  # it runs on, as if unknown here
            answer(reply, None)
            return
        if (running := self._running.get(response_id)) is not None:
            if running.ended is not None:  # a cancel racing the end changes nothing
                answer(reply, running.ended)
                return
            running.stop("cancelled")
            running.waiters.append(reply)  # answered when the slot has stored the end
            return
        if (waiting := self._unqueue(response_id)) is not None:
            nursery.start_soon(self._path.end_queued, waiting.command, reply, "cancelled")
            return
        answer(reply, None)

    def _withdraw(self, response_id: str, nursery: trio.Nursery) -> None:
        """The requester left: a queued response leaves the line at once, a running one
        stops; either is stored `cancelled`, as the client may have seen its id."""
        if (running := self._running.get(response_id)) is not None:
            if running.ended is None:
                running.stop("gone")
            return
        if (waiting := self._unqueue(response_id)) is not None:
            nursery.start_soon(self._path.end_queued, waiting.command, None, "gone")

    def _end_all(self, nursery: trio.Nursery) -> None:
        while self._line:
            waiting = self._line.popleft()
            self._waiting_requests -= not waiting.waits
            nursery.start_soon(self._path.end_queued, waiting.command, None, "shutdown")
        for running in self._running.values():
            if running.ended is None:
                running.stop("shutdown")

    def _wake_idle_waiters(self) -> None:
        if self._idle_waiters and len(self._idle) == self._parallel and not self._line:
            for waiter in self._idle_waiters:
                answer(waiter, None)
            self._idle_waiters.clear()

    # --- slots -------------------------------------------------------------------------

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
        running = Running(request)
        self._running[request.record.id] = running
        try:
            await self._path.run(command, running)
        finally:
            del self._running[request.record.id]
            for waiter in running.waiters:  # only when ending itself failed
                answer(waiter, running.ended)
