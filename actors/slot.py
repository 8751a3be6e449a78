"""One response's path through a generation slot, from the model's tokens to its end.

`ResponsePath.run` opens a sequence in the model actor, relays its tokens through a
`ResponseBuilder` to the requester, and ends the record in one place (`end`: stored, its
turn appended, its reasoning remembered) before the requester sees the end. A request
with a prelude (compaction) runs it first, in the same slot. The scheduler owns which
slot runs what; this module owns what a slot does.
"""

from __future__ import annotations

import contextlib
import functools
import logging
from dataclasses import dataclass, field
from typing import Literal

import trio

from mlxcel.actors.messages import Generate, answer
from mlxcel.errors import InvalidRequest, StoreUnavailable
from mlxcel.generation import GenerationRequest, PrefillProgress, SequenceFailed, TokenStep
from mlxcel.items import Message, Reasoning, ResponseError, ResponseRecord, Usage, failed
from mlxcel.metrics import Metrics, TokenTimer
from mlxcel.model.actor import ModelHandle
from mlxcel.respond.builder import ResponseBuilder
from mlxcel.respond.events import (
    CompactionStarted,
    KeepAlive,
    PromptRead,
    ResponseEvent,
    ResponseFinished,
    ResponseInProgress,
    StreamError,
)
from mlxcel.store import StoreHandle
from mlxcel.store.echo import EchoHandle, signed_key, trace_signature, turn_key

log = logging.getLogger(__name__)

STORE_DEADLINE_SECS = 10.0
"""Ending a record is shielded from cancellation, but never waits on a stopped store
for ever (a hard shutdown)."""

Ending = Literal["cancelled", "gone", "shutdown"]


class ClientGone(Exception):
    """The requester stopped reading (closed its channel, or missed the send deadline)."""


@dataclass
class Running:
    """A response a slot is running: how to stop it, and who waits for its end."""

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


class ResponsePath:
    """What a slot does with one response (see the module docstring)."""

    def __init__(
        self,
        model: ModelHandle,
        store: StoreHandle,
        echo: EchoHandle,
        *,
        keepalive_secs: float,
        send_timeout_secs: float,
        metrics: Metrics,
    ) -> None:
        self._model = model
        self._store = store
        self._echo = echo
        self._keepalive = keepalive_secs
        self._send_timeout = send_timeout_secs
        self._metrics = metrics

    async def run(self, command: Generate, running: Running) -> None:
        """Run the response to its end, stored before its requester sees it."""
        request = command.request
        events, record = await self._outcome(command, running)
        self._count(record)
        running.ended = record = await self.end(request, record)
        self._metrics.response_seconds.observe(trio.current_time() - command.submitted)
        for waiter in running.waiters:
            answer(waiter, record)
        running.waiters.clear()
        # Outside the cancel scope: a cancel racing the end cannot cut the `.done`
        # events short, and the record is already stored.
        await self._deliver(command.reply, [*events, ResponseFinished(record)])

    async def end_queued(
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
            record = await self.end(request, record)
            if waiter is not None:
                answer(waiter, record)
            await self._deliver(command.reply, [*events, ResponseFinished(record)])

    async def _outcome(
        self, command: Generate, running: Running
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
                    stop=request.sampling.stop,
                )
                await self._send(command.reply, builder.start(announced=announced))
                timer = TokenTimer(self._metrics, command.submitted)
                return await self._drive(command.reply, request, builder, timer=timer)
            assert running.ending is not None  # only `stop` cancels the scope
            ending = running.ending
        except ClientGone:
            log.info("client left %s; its sequence is stopped", request.record.id)
            ending = "gone"
        except InvalidRequest as exc:  # a prelude that cannot help (compaction)
            log.info("response %s: %s", request.record.id, exc.message)
            error = StreamError(request.record.id, "invalid_prompt", exc.message)
            return [error], _failed(request, exc.message, code="invalid_prompt")
        except Exception:
            # Whatever failed while building this response fails it alone.
            log.exception("response %s failed", request.record.id)
            message = "The server had an error while generating this response."
            error = StreamError(request.record.id, "server_error", message)
            return [error], _failed(request, message)
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
        generate = functools.partial(self._generate_here, reply, command.request)
        return await request.prelude(generate)

    async def _generate_here(
        self,
        reply: trio.MemorySendChannel[ResponseEvent],
        owner: GenerationRequest,
        request: GenerationRequest,
    ) -> ResponseRecord:
        """`request` run in this slot for the response `owner` (its summary): only
        keep-alives reach the requester, and its tokens are charged to the owner's key
        (it read the whole history on the key's behalf)."""
        builder = ResponseBuilder(request.record, len(request.prompt))
        owner_id = owner.record.id
        _, record = await self._drive(reply, request, builder, owner=owner_id, forward=False)
        self._count(record)
        await _spend(owner, record, final=False)
        return record

    async def _drive(
        self,
        reply: trio.MemorySendChannel[ResponseEvent],
        request: GenerationRequest,
        builder: ResponseBuilder,
        *,
        owner: str | None = None,
        forward: bool = True,
        timer: TokenTimer | None = None,
    ) -> tuple[list[ResponseEvent], ResponseRecord]:
        """Generate `request`'s tokens through `builder`, sending its events (or, when not
        `forward`, only keep-alives for `owner`) to the requester; `timer` times them.
        When nothing was sent for the keep-alive interval, a keep-alive says how much of
        the prompt is read."""
        quiet = _Quiet(owner or request.record.id, len(request.prompt), self._keepalive)
        prompt, sampling, tenant = list(request.prompt), request.sampling, request.record.tenant
        async with self._model.open_sequence(prompt, sampling, tenant) as tokens:
            while True:
                with trio.move_on_at(quiet.until) as idle:
                    try:
                        step = await tokens.receive()
                    except trio.EndOfChannel:
                        break
                if idle.cancelled_caught:
                    # A reader with events still unread needs no keep-alive (and a
                    # stalled one must not have its room filled with them).
                    keepalive = quiet.keepalive()
                    if reply.statistics().current_buffer_used == 0:
                        await self._send(reply, [keepalive])
                    continue
                if isinstance(step, PrefillProgress):
                    quiet.read = step.read
                    continue
                if isinstance(step, SequenceFailed):
                    return builder.fail("server_error", step.message)
                if timer is not None:
                    timer.tick(trio.current_time())
                quiet.read = quiet.total
                events = builder.feed(step)
                if builder.generated == 1:  # the first step tells what the prompt cache did
                    events = [_prompt_read(request, step), *events]
                if forward and events:
                    await self._send(reply, events)
                    quiet.sent()
                if builder.stopped:  # a stop string: leaving removes the sequence
                    return builder.finish("stop")
                if step.finish is not None:
                    return builder.finish(step.finish)
        # The channel ended without a finishing step: the engine dropped the sequence.
        return builder.fail("server_error", "the sequence was dropped")

    def _count(self, record: ResponseRecord) -> None:
        """The tokens of a generation a slot ran (a summary too)."""
        if record.usage is not None:
            usage = record.usage
            self._metrics.count_tokens(usage.input_tokens, usage.output_tokens, usage.cached_tokens)

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

    async def end(self, request: GenerationRequest, record: ResponseRecord) -> ResponseRecord:
        """The one place a response ends: stored, its turn appended and its reasoning
        remembered, before the requester can see the end. Called once per response."""
        with trio.move_on_after(STORE_DEADLINE_SECS) as scope:
            scope.shield = True  # a cancel must not interrupt storing its result
            try:
                if record.store and not record.background:  # jobs store their own
                    await self._store.put(record)
                conversation = record.echo.conversation_id
                if conversation is not None and record.status in ("completed", "incomplete"):
                    turn = record.input_items + record.output
                    await self._store.append(
                        conversation, turn, response_id=record.id, tenant=record.tenant
                    )
                await self._remember_reasoning(request, record)
            except (trio.BrokenResourceError, trio.ClosedResourceError):
                log.warning("the store has stopped; response %s was not kept", record.id)
            except StoreUnavailable:
                log.warning("the store failed; response %s was not kept", record.id)
            await _spend(request, record)
        return record

    async def _remember_reasoning(self, request: GenerationRequest, record: ResponseRecord) -> None:
        """An ordinary reply (reasoning, then a message; no tool calls) is remembered; a
        reply whose traces were handed out signed has each filed under its signature."""
        prefix = request.echo_prefix
        if prefix is None or record.status not in ("completed", "incomplete"):
            return
        if request.signs_reasoning:
            for item in record.output:
                if isinstance(item, Reasoning):
                    key = signed_key(record.tenant, trace_signature(prefix, item.text))
                    await self._echo.remember(key, item.text)
        match record.output:
            case (Reasoning(text=trace), Message() as message) if (
                trace.strip() and record.status == "completed"
            ):
                await self._echo.remember(turn_key(prefix, message.text), trace)


async def _spend(request: GenerationRequest, record: ResponseRecord, *, final: bool = True) -> None:
    """Charge the response's tokens to its key's token limits (when any counts them):
    `final` settles its reservation; not final, tokens spent on its behalf before."""
    if request.spend is None or record.usage is None:
        return
    try:
        await request.spend(record.usage.total_tokens, final=final)
    except (trio.BrokenResourceError, trio.ClosedResourceError, StoreUnavailable):
        log.warning("the store failed; the tokens of response %s were not counted", record.id)


@dataclass
class _Quiet:
    """When the requester last heard from a running response, and how far its prompt got."""

    response_id: str
    total: int
    interval: float
    read: int = 0
    until: float = field(init=False)

    def __post_init__(self) -> None:
        self.sent()

    def sent(self) -> None:
        self.until = trio.current_time() + self.interval

    def keepalive(self) -> KeepAlive:
        self.sent()
        return KeepAlive(self.response_id, None, self.read, self.total)


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
    """Failed before any token was counted: its prompt is its only usage."""
    usage = Usage(input_tokens=len(request.prompt))
    return failed(request.record, ResponseError(code, message), usage=usage)


def _prompt_read(request: GenerationRequest, first: TokenStep) -> PromptRead:
    """How much of `request`'s prompt the cache served and kept, told by its first step."""
    prompt = len(request.prompt)
    return PromptRead(request.record.id, prompt, first.cached_tokens, first.cache_write_tokens)
