"""The scheduler: generation slots, the waiting queue, and the path of one response.

A control task owns admission. Free slots report `SlotIdle`; a submitted command goes
to an idle slot at once or waits in one FIFO line. Requests may wait only while fewer
than `--max-queue-depth` requests are waiting (else `QueueFull`: 503); background jobs
always wait their turn (the job cap bounds them). The control task also cancels and
withdraws queued or running responses, and ends them all at shutdown. A slot runs its
response to the end: it opens a sequence in the model actor, relays the model's tokens
through a `ResponseBuilder` to the requester, and ends the record in one place
(`_end`: stored, its turn appended, remembered) before the requester sees the end.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import logging
from collections import deque
from dataclasses import dataclass, field
from typing import Literal, TypeVar

import trio

from mlxcel.actors.echo import EchoHandle, turn_key
from mlxcel.actors.messages import (
    CancelResponse,
    CompactionStarted,
    EndAll,
    Generate,
    KeepAlive,
    ReadSchedulerStatistics,
    ResponseEvent,
    ResponseFinished,
    ResponseInProgress,
    SchedulerCommand,
    SchedulerStatistics,
    SlotIdle,
    StreamError,
    Submit,
    WaitIdle,
    Withdraw,
)
from mlxcel.actors.response_stream import SchedulerHandle
from mlxcel.actors.responses import ResponseBuilder
from mlxcel.actors.store import StoreHandle
from mlxcel.errors import InvalidRequest
from mlxcel.generation import GenerationRequest, SequenceFailed
from mlxcel.items import Message, Reasoning, ResponseError, ResponseRecord, Usage
from mlxcel.model.actor import ModelHandle

__all__ = ["ClientGone", "Scheduler", "SchedulerHandle"]

log = logging.getLogger(__name__)

STORE_DEADLINE_SECS = 10.0
"""Ending a record is shielded from cancellation, but never waits on a stopped store
for ever (a hard shutdown)."""

Ending = Literal["cancelled", "gone", "shutdown"]
T = TypeVar("T")


class ClientGone(Exception):
    """The requester stopped reading (closed its channel, or missed the send deadline)."""


@dataclass
class _Running:
    request: GenerationRequest
    scope: trio.CancelScope = field(default_factory=trio.CancelScope)
    ending: Ending | None = None
    """Why the scope was cancelled (the first reason wins)."""
    ended: ResponseRecord | None = None
    """The final record, once `_end` has stored it."""
    waiters: list[trio.MemorySendChannel[ResponseRecord | None]] = field(default_factory=list)

    def stop(self, ending: Ending) -> None:
        if self.ending is None:
            self.ending = ending
        self.scope.cancel()


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
        send_timeout_secs: float = 30.0,
    ) -> None:
        self._model = model
        self._store = store
        self._echo = echo
        self._parallel = parallel
        self._depth = max_queue_depth
        self._keepalive = keepalive_secs
        self._send_timeout = send_timeout_secs
        # Owned by this actor's tasks (control and slots), all on the Trio thread.
        self._line: deque[_Waiting] = deque()  # bounded: depth requests + the job cap
        self._waiting_requests = 0
        self._idle: deque[trio.MemorySendChannel[Generate]] = deque()  # at most `parallel`
        self._running: dict[str, _Running] = {}
        self._idle_waiters: list[trio.MemorySendChannel[None]] = []

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
                    case Submit(generate, waits, reply):
                        _answer(reply, self._admit(generate, waits))
                    case SlotIdle(slot):
                        self._idle.append(slot)
                        self._dispatch()
                    case CancelResponse(response_id, reply):
                        self._cancel(response_id, reply, nursery)
                    case Withdraw(response_id):
                        self._withdraw(response_id, nursery)
                    case WaitIdle(reply):
                        self._idle_waiters.append(reply)
                    case EndAll(reply):
                        self._end_all(nursery)
                        self._idle_waiters.append(reply)
                    case ReadSchedulerStatistics(reply):
                        busy = self._parallel - len(self._idle)
                        _answer(reply, SchedulerStatistics(self._parallel, busy, len(self._line)))
                self._wake_idle_waiters()

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

    def _unqueue(self, response_id: str) -> _Waiting | None:
        for waiting in self._line:
            if waiting.command.request.record.id == response_id:
                self._line.remove(waiting)
                self._waiting_requests -= not waiting.waits
                return waiting
        return None

    def _cancel(
        self,
        response_id: str,
        reply: trio.MemorySendChannel[ResponseRecord | None],
        nursery: trio.Nursery,
    ) -> None:
        if (running := self._running.get(response_id)) is not None:
            if running.ended is not None:  # a cancel racing the end changes nothing
                _answer(reply, running.ended)
                return
            running.stop("cancelled")
            running.waiters.append(reply)  # answered when the slot has stored the end
            return
        if (waiting := self._unqueue(response_id)) is not None:
            nursery.start_soon(self._end_queued, waiting.command, reply, "cancelled")
            return
        _answer(reply, None)

    def _withdraw(self, response_id: str, nursery: trio.Nursery) -> None:
        """The requester left: a queued response leaves the line at once, a running one
        stops; either is stored `cancelled`, as the client may have seen its id."""
        if (running := self._running.get(response_id)) is not None:
            if running.ended is None:
                running.stop("gone")
            return
        if (waiting := self._unqueue(response_id)) is not None:
            nursery.start_soon(self._end_queued, waiting.command, None, "gone")

    def _end_all(self, nursery: trio.Nursery) -> None:
        while self._line:
            waiting = self._line.popleft()
            self._waiting_requests -= not waiting.waits
            nursery.start_soon(self._end_queued, waiting.command, None, "shutdown")
        for running in self._running.values():
            if running.ended is None:
                running.stop("shutdown")

    def _wake_idle_waiters(self) -> None:
        if self._idle_waiters and len(self._idle) == self._parallel and not self._line:
            for waiter in self._idle_waiters:
                _answer(waiter, None)
            self._idle_waiters.clear()

    async def _end_queued(
        self,
        command: Generate,
        waiter: trio.MemorySendChannel[ResponseRecord | None] | None,
        ending: Ending,
    ) -> None:
        """A response ended before a slot took it: stored and reported like any end."""
        request = command.request
        builder = ResponseBuilder(request.record, len(request.prompt))
        events, record = _stopped(builder, ending)
        async with command.reply:
            record = await self._end(request, record)
            if waiter is not None:
                _answer(waiter, record)
            await self._deliver(command.reply, [*events, ResponseFinished(record)])

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
        running = _Running(request)
        self._running[request.record.id] = running
        try:
            events, record = await self._outcome(command, running)
            running.ended = record = await self._end(request, record)
            for waiter in running.waiters:
                _answer(waiter, record)
            running.waiters.clear()
            # Outside the cancel scope: a cancel racing the end cannot cut the `.done`
            # events short, and the record is already stored.
            await self._deliver(command.reply, [*events, ResponseFinished(record)])
        finally:
            del self._running[request.record.id]
            for waiter in running.waiters:  # only when ending itself failed
                _answer(waiter, running.ended)

    async def _outcome(
        self, command: Generate, running: _Running
    ) -> tuple[list[ResponseEvent], ResponseRecord]:
        """The response's closing events and final record, however it ends."""
        request = command.request
        builder: ResponseBuilder | None = None
        try:
            with running.scope:
                announced = request.prelude is not None
                if announced:
                    request = await self._prelude(command)
                builder = ResponseBuilder(
                    request.record,
                    len(request.prompt),
                    request.tools,
                    reasoning_opened=request.reasoning_opened,
                    compaction=request.compaction,
                )
                await self._send(command.reply, builder.start(announced=announced))
                return await self._drive(command.reply, request, builder)
            assert running.ending is not None  # only `stop` cancels the scope
            ending = running.ending
        except ClientGone:
            log.info("client left %s; its sequence is stopped", request.record.id)
            ending = "gone"
        except InvalidRequest as exc:  # a prelude that cannot help (compaction)
            log.info("response %s: %s", request.record.id, exc.message)
            failed = StreamError(request.record.id, "invalid_prompt", exc.message)
            return [failed], _failed(request, exc.message, code="invalid_prompt")
        except Exception:
            # Whatever failed while building this response fails it alone.
            log.exception("response %s failed", request.record.id)
            message = "The server had an error while generating this response."
            failed = StreamError(request.record.id, "server_error", message)
            return [failed], _failed(request, message)
        if builder is None:
            builder = ResponseBuilder(request.record, len(request.prompt))
        try:
            return _stopped(builder, ending)
        except Exception:
            log.exception("response %s could not be closed", request.record.id)
            return _stopped(ResponseBuilder(request.record, len(request.prompt)), ending)

    async def _prelude(self, command: Generate) -> GenerationRequest:
        """The request's first phase (compaction), in this slot under its one admission:
        announced at once, its summary generated here with keep-alives flowing."""
        request, reply = command.request, command.reply
        assert request.prelude is not None
        response_id = request.record.id
        started = CompactionStarted(response_id, len(request.prompt))
        await self._send(reply, [ResponseInProgress(request.record), started])
        generate = functools.partial(self._generate_here, reply, response_id)
        return await request.prelude(generate)

    async def _generate_here(
        self, reply: trio.MemorySendChannel[ResponseEvent], owner: str, request: GenerationRequest
    ) -> ResponseRecord:
        """`request` run in this slot for the response `owner` (its summary): only
        keep-alives reach the requester."""
        builder = ResponseBuilder(request.record, len(request.prompt))
        _, record = await self._drive(reply, request, builder, owner=owner, forward=False)
        return record

    async def _drive(
        self,
        reply: trio.MemorySendChannel[ResponseEvent],
        request: GenerationRequest,
        builder: ResponseBuilder,
        *,
        owner: str | None = None,
        forward: bool = True,
    ) -> tuple[list[ResponseEvent], ResponseRecord]:
        """Generate `request`'s tokens through `builder`, sending its events (or, when not
        `forward`, only keep-alives for `owner`) to the requester."""
        alive = KeepAlive(owner or request.record.id)
        async with self._model.open_sequence(list(request.prompt), request.sampling) as tokens:
            while True:
                with trio.move_on_after(self._keepalive) as idle:
                    try:
                        step = await tokens.receive()
                    except trio.EndOfChannel:
                        break
                if idle.cancelled_caught:
                    await self._send(reply, [alive])
                    continue
                if isinstance(step, SequenceFailed):
                    return builder.fail("server_error", step.message)
                events = builder.feed(step)
                if forward:
                    await self._send(reply, events)
                if step.finish is not None:
                    return builder.finish(step.finish)
        # The channel ended without a finishing step: the engine dropped the sequence.
        return builder.fail("server_error", "the sequence was dropped")

    async def _send(
        self, reply: trio.MemorySendChannel[ResponseEvent], events: list[ResponseEvent]
    ) -> None:
        """Send to the requester, who must take each event within the send deadline."""
        for event in events:
            with trio.move_on_after(self._send_timeout) as late:
                try:
                    await reply.send(event)
                except (trio.BrokenResourceError, trio.ClosedResourceError):
                    raise ClientGone from None
            if late.cancelled_caught:
                raise ClientGone

    async def _deliver(
        self, reply: trio.MemorySendChannel[ResponseEvent], events: list[ResponseEvent]
    ) -> None:
        """The closing events: a requester gone by now changes nothing (the record is kept)."""
        with contextlib.suppress(ClientGone):
            await self._send(reply, events)

    async def _end(self, request: GenerationRequest, record: ResponseRecord) -> ResponseRecord:
        """The one place a response ends: stored, its turn appended and its reasoning
        remembered, before the requester can see the end. Called once per response."""
        with trio.move_on_after(STORE_DEADLINE_SECS) as scope:
            scope.shield = True  # a cancel must not interrupt storing its result
            try:
                if record.echo.store and not record.echo.background:  # jobs store their own
                    await self._store.put(record)
                conversation = record.echo.conversation_id
                if conversation is not None and record.status in ("completed", "incomplete"):
                    turn = record.input_items + record.output
                    await self._store.append(conversation, turn, response_id=record.id)
                await self._remember_reasoning(request, record)
            except (trio.BrokenResourceError, trio.ClosedResourceError):
                log.warning("the store has stopped; response %s was not kept", record.id)
        return record

    async def _remember_reasoning(self, request: GenerationRequest, record: ResponseRecord) -> None:
        """An ordinary reply (reasoning, then a message; no tool calls) is remembered."""
        if request.echo_prefix is None or record.status != "completed":
            return
        match record.output:
            case (Reasoning(text=trace), Message() as message) if trace.strip():
                await self._echo.remember(turn_key(request.echo_prefix, message.text), trace)


def _stopped(
    builder: ResponseBuilder, ending: Ending
) -> tuple[list[ResponseEvent], ResponseRecord]:
    """A response stopped before its end: cancelled (by a cancel or a client that left),
    or cut short by a shutdown (what was generated is kept, `incomplete`)."""
    if ending == "shutdown":
        return builder.interrupt("incomplete", reason="server_shutdown")
    return builder.interrupt("cancelled")


def _failed(
    request: GenerationRequest, message: str, *, code: str = "server_error"
) -> ResponseRecord:
    return dataclasses.replace(
        request.record,
        status="failed",
        output=(),
        usage=Usage(input_tokens=len(request.prompt)),
        error=ResponseError(code, message),
    )


def _answer(reply: trio.MemorySendChannel[T], value: T) -> None:
    """Answer a one-shot reply channel (buffer 1); a requester that left changes nothing."""
    with contextlib.suppress(trio.BrokenResourceError, trio.ClosedResourceError, trio.WouldBlock):
        reply.send_nowait(value)
