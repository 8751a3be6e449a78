"""The requester's side of the scheduler: its handle, and one response's events,
owned by the requester from before the command leaves.

The requester opens the reply channel, owns its receive end, and only then submits.
Whatever way it leaves (done, cancelled, an error, a client that hung up), closing the
stream closes that end and tells the scheduler to withdraw the response: a queued one
leaves the line at once and a running one frees its slot. A stream that is never
closed (a body the HTTP server never started) still cannot hold a slot: the slot gives
up on any reader after the send deadline.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Sequence
from types import TracebackType
from typing import TypeVar

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
    Submit,
    Withdraw,
)
from mlxcel.errors import GenerationFailed, QueueFull, ShuttingDown, StoreUnavailable
from mlxcel.generation import GenerationRequest
from mlxcel.items import ResponseRecord
from mlxcel.respond.events import ResponseEvent, ResponseFinished

T = TypeVar("T")

WITHDRAW_DEADLINE_SECS = 5.0
"""The control task never blocks, so telling it takes no time; this only bounds a
shutdown that already stopped it."""


EVENTS_PER_TOKEN = 2
"""Room per token: most tokens make one delta; the items and parts they open and close
take the rest. The room is bounded by `max_tokens`; an unread response that outgrows it
(a long prelude's keep-alives) waits on its reader within the send deadline again."""
FRAME_EVENTS = 64
"""The events around the tokens: created, in progress, the closing `.done`s, the end."""


class ResponseStream:
    """The events of one submitted response; an async iterator and context manager."""

    def __init__(
        self,
        control: trio.MemorySendChannel[SchedulerCommand],
        request: GenerationRequest,
        *,
        waits: bool,
        max_queue_depth: int,
    ) -> None:
        self._control = control
        self._request = request
        self._waits = waits
        self._depth = max_queue_depth
        # Room for the response's events, so its slot does not wait on a slow reader:
        # it is free for the next response once the sequence ends, and the reader takes
        # the rest from here at its own pace.
        room = EVENTS_PER_TOKEN * request.sampling.max_tokens + FRAME_EVENTS
        self._send, self._recv = trio.open_memory_channel[ResponseEvent](room)
        self._submitted = False
        self._finished = False
        self._closed = False

    @property
    def response_id(self) -> str:
        return self._request.record.id

    async def submit(self) -> None:
        """Queue the response, or raise `QueueFull` (every slot and queue place taken) or
        `ShuttingDown` (the server drains).

        A background job (`waits`) is always queued. Cancelled or failing here, the
        stream closes itself, so nothing is left holding a place."""
        await submit_together([self])

    async def _refused(self) -> None:
        """Not admitted: closed, and what its request reserved returned."""
        self._submitted = False
        await self.aclose()
        await release(self._request)

    def _command(self) -> Generate:
        """The command that queues this response, marked submitted first: a cancel can
        land after the control task took it."""
        self._submitted = True
        return Generate(self._request, self._send)

    @property
    def prompt_tokens(self) -> int:
        return len(self._request.prompt)

    async def queue_position(self) -> int | None:
        """The response's place in the waiting line (1 = next); None once a slot has it."""
        reply, position = trio.open_memory_channel[int | None](1)
        try:
            await self._control.send(ReadQueuePosition(self.response_id, reply))
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            return None  # a stopped scheduler holds nothing
        return await position.receive()

    async def aclose(self) -> None:
        """Leave: close our end and withdraw the response if it has not finished."""
        if self._closed:
            return
        self._closed = True
        self._recv.close()  # the slot's next send raises BrokenResourceError: it stops
        if self._submitted and not self._finished:
            with trio.move_on_after(WITHDRAW_DEADLINE_SECS) as scope:
                scope.shield = True
                # A stopped scheduler holds nothing any more.
                with contextlib.suppress(trio.BrokenResourceError, trio.ClosedResourceError):
                    await self._control.send(Withdraw(self.response_id))

    async def __aenter__(self) -> ResponseStream:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()

    def __aiter__(self) -> ResponseStream:
        return self

    async def __anext__(self) -> ResponseEvent:
        if self._finished:
            raise StopAsyncIteration
        try:
            event = await self._recv.receive()
        except (trio.EndOfChannel, trio.ClosedResourceError):
            raise StopAsyncIteration from None
        if isinstance(event, ResponseFinished):
            self._finished = True
        return event


async def submit_together(streams: Sequence[ResponseStream]) -> None:
    """Queue the responses of `streams` (all on one scheduler, all requests or all jobs)
    in one step, all or none: the `n` choices of one request are admitted only if every
    one fits, so two such requests racing for the last slots never leave each other
    half admitted and both refused. Refused, every stream closes and returns its
    reservation (`QueueFull`, or `ShuttingDown` while the server drains); cancelled or
    failing, every stream closes."""
    first = streams[0]
    try:
        answer_send, answer = trio.open_memory_channel[Admission](1)
        commands = tuple(stream._command() for stream in streams)
        await first._control.send(Submit(commands, first._waits, answer_send))
        admitted = await answer.receive()
    except BaseException:
        for stream in streams:
            await stream.aclose()  # shielded inside
        raise
    if admitted is Admission.ADMITTED:
        return
    for stream in streams:
        await stream._refused()
    if admitted is Admission.CLOSED:
        raise ShuttingDown(
            "The server is shutting down; retry on another server.",
            code="server_shutting_down",
        )
    raise QueueFull(
        "The server is busy: every generation slot is in use and the waiting "
        f"queue is full ({first._depth}). Retry shortly.",
        code="server_overloaded",
    )


class SchedulerHandle:
    """What the rest of the server holds of one scheduler: its control channel and the calls
    made over it, so no caller touches the waiting line or the slots directly."""

    def __init__(self, control: trio.MemorySendChannel[SchedulerCommand], depth: int) -> None:
        self._control = control
        self.max_queue_depth = depth

    @property
    def control(self) -> trio.MemorySendChannel[SchedulerCommand]:
        """The scheduler's inbox (a stream routed to this scheduler sends there)."""
        return self._control

    def stream(self, request: GenerationRequest, *, waits: bool = False) -> ResponseStream:
        """A stream for `request`, owned by the caller; `submit()` it, then read it."""
        return ResponseStream(
            self._control, request, waits=waits, max_queue_depth=self.max_queue_depth
        )

    async def generate(self, request: GenerationRequest, *, waits: bool = False) -> ResponseRecord:
        """Run a request to its end: its final record (the events on the way are dropped)."""
        async with self.stream(request, waits=waits) as events:
            await events.submit()
            return await final_record(events)

    async def cancel(self, response_id: str, *, tenant: str = "") -> ResponseRecord | None:
        """Cancel a queued or running response of `tenant`; its final record, or None if
        no such response is held (another tenant's runs on)."""
        return await self._ask(lambda reply: CancelResponse(response_id, reply, tenant))

    async def drain(self) -> None:
        """Refuse every new submission from now on (`ShuttingDown`, 503); return once no
        response is queued or running."""
        await self._ask(Drain)

    async def end_all(self) -> None:
        """End every queued and running response now (shutdown); returns when all ended."""
        await self._ask(EndAll)

    async def statistics(self) -> SchedulerStatistics:
        return await self._ask(ReadSchedulerStatistics)

    async def _ask(self, make: Callable[[trio.MemorySendChannel[T]], SchedulerCommand]) -> T:
        send, recv = trio.open_memory_channel[T](1)
        await self._control.send(make(send))
        return await recv.receive()


async def final_record(events: ResponseStream) -> ResponseRecord:
    """A submitted response read to its end: its final record (the events on the way
    are dropped)."""
    async for event in events:
        if isinstance(event, ResponseFinished):
            return event.record
    raise GenerationFailed("The response ended without a result.")


RELEASE_DEADLINE_SECS = 10.0
"""Returning a reservation is shielded from cancellation, but never waits on a stopped
store for ever."""


async def release(request: GenerationRequest) -> None:
    """Return what a request refused before it ran reserved on its key's token limits
    (a store that cannot take it back only leaves the key's count high until its window
    ends)."""
    if request.spend is None:
        return
    failures = (StoreUnavailable, trio.BrokenResourceError, trio.ClosedResourceError)
    with trio.move_on_after(RELEASE_DEADLINE_SECS, shield=True), contextlib.suppress(*failures):
        await request.spend(0)
