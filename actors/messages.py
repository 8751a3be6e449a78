"""The message catalogue: every command an actor accepts and the replies it sends.

Commands are named for what they ask (`Generate`, `PutResponse`). Replies travel on a
channel the command brings; the producer closes it when done. The events a response
streams back (`OutputTextDelta`, `ResponseFinished`) are catalogued in `respond/events.py`.
"""

from __future__ import annotations

import contextlib
import enum
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from types import TracebackType
from typing import Protocol, TypeVar

import trio

from mlxcel.errors import MlxcelError
from mlxcel.generation import GenerationRequest
from mlxcel.items import ResponseRecord
from mlxcel.respond.events import ResponseEvent

T = TypeVar("T")


def answer(reply: trio.MemorySendChannel[T], value: T) -> None:
    """Answer a one-shot reply channel (buffer 1); a requester that left changes nothing."""
    with contextlib.suppress(trio.BrokenResourceError, trio.ClosedResourceError, trio.WouldBlock):
        reply.send_nowait(value)


class JobEvents(Protocol):
    """A response stream as a background job reads it (`actors/response_stream.py`'s
    `ResponseStream`): submitted once, its events read to the end, closed on leaving."""

    async def submit(self) -> None: ...

    def __aiter__(self) -> AsyncIterator[ResponseEvent]: ...

    async def __aenter__(self) -> JobEvents: ...

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None: ...


class HeldModel(Protocol):
    """What a background job needs of its request's lease on a model (the fleet's
    `ModelLease`, `fleet/lease.py`): a share that keeps the model loaded until the job
    ends, and a stream on that very model. A protocol, so the actors never import the
    fleet that runs above them."""

    def share(self) -> HeldModel: ...

    def end(self) -> None: ...

    def stream(self, request: GenerationRequest, *, waits: bool = False) -> JobEvents: ...


# --- scheduler ---------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Generate:
    request: GenerationRequest
    reply: trio.MemorySendChannel[ResponseEvent]
    submitted: float = field(default_factory=trio.current_time)
    """When the requester submitted it (Trio's clock): its latencies count from here."""


class Admission(enum.Enum):
    """The scheduler's answer to a `Submit`."""

    ADMITTED = "admitted"
    FULL = "full"
    """Every slot and queue place is taken (a request; a background job always waits)."""
    CLOSED = "closed"
    """The server is draining for shutdown: nothing new starts."""


@dataclass(frozen=True, slots=True)
class Submit:
    """Queue `commands`, each for a slot of its own; the reply says whether they were
    accepted, all of them or none (the `n` choices of one request).

    Requests (`waits=False`) are refused unless the idle slots and the waiting queue's
    free places can take them all; background jobs (`waits=True`) are always accepted
    and wait their turn (the job cap bounds them). Once the drain has begun (`Drain`),
    every submission is refused."""

    commands: tuple[Generate, ...]
    waits: bool
    reply: trio.MemorySendChannel[Admission]


@dataclass(frozen=True, slots=True)
class SlotIdle:
    """A slot is free; the scheduler hands its next command to `inbox`."""

    inbox: trio.MemorySendChannel[Generate]


@dataclass(frozen=True, slots=True)
class CancelResponse:
    """Stop a queued or running response of `tenant`; the reply is its final (cancelled)
    record, or None when the scheduler holds no such response of that tenant."""

    response_id: str
    reply: trio.MemorySendChannel[ResponseRecord | None]
    tenant: str = ""


@dataclass(frozen=True, slots=True)
class Withdraw:
    """The requester of `response_id` left (closed its reply channel): a queued response
    leaves the line at once, a running one is stopped and its slot freed."""

    response_id: str


@dataclass(frozen=True, slots=True)
class EndAll:
    """Shutdown: end every queued and running response now, each with its terminal event;
    the reply comes once every slot is idle again."""

    reply: trio.MemorySendChannel[None]


@dataclass(frozen=True, slots=True)
class Drain:
    """Shutdown's first step: refuse every submission from now on (a request whose body
    arrives late must not start), and reply once no response is queued or running."""

    reply: trio.MemorySendChannel[None]


@dataclass(frozen=True, slots=True)
class ReadQueuePosition:
    """The response's place in the waiting line (1 = next), or None when it is not there
    (running, or ended)."""

    response_id: str
    reply: trio.MemorySendChannel[int | None]


@dataclass(frozen=True, slots=True)
class SchedulerStatistics:
    slots: int
    busy: int
    queued: int


@dataclass(frozen=True, slots=True)
class ReadSchedulerStatistics:
    reply: trio.MemorySendChannel[SchedulerStatistics]


SchedulerCommand = (
    Submit
    | CancelResponse
    | SlotIdle
    | Withdraw
    | EndAll
    | Drain
    | ReadSchedulerStatistics
    | ReadQueuePosition
)


# --- job supervisor ------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class JobAdmitted:
    """The job is in: its `queued` record, already pinned in the store."""

    record: ResponseRecord


@dataclass(frozen=True, slots=True)
class JobRefused:
    """The job was not admitted (the job cap, or the byte budget of active jobs)."""

    error: MlxcelError
    """What the submitter raises (`RateLimited`: 429)."""


JobAdmission = JobAdmitted | JobRefused


@dataclass(frozen=True, slots=True)
class SubmitJob:
    """Admit a background job that runs on the model `lease` holds (the job owns that
    share from now on and ends it when the job ends, or at once if refused); the reply
    says whether it was admitted."""

    request: GenerationRequest
    lease: HeldModel
    reply: trio.MemorySendChannel[JobAdmission]


@dataclass(frozen=True, slots=True)
class CancelJob:
    """Cancel an active job of `tenant`; the reply is its final record, or None if no
    such job of that tenant is active."""

    response_id: str
    reply: trio.MemorySendChannel[ResponseRecord | None]
    tenant: str = ""


@dataclass(frozen=True, slots=True)
class EndJobs:
    """Shutdown: end every active job `failed`; the reply comes once all are stored."""

    reply: trio.MemorySendChannel[None]


JobCommand = SubmitJob | CancelJob | EndJobs
