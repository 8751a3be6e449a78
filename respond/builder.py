"""Turns a sequence's token events into Responses output items and stream events.

One builder per response. It owns the item ids, so the ids streamed in events are the
ids of the final object, and it produces the final record (status, output, usage). With
function tools, a tool-call parser splits the text into message text and calls; with a
required call, or while a reply may still turn out to be a bare JSON call, text is held
back until the end, whose parse is authoritative. The calls themselves are
`respond/tool_calls.py`'s.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Sequence
from typing import Literal

from mlxcel.generation import CompactionReport, FinishReason, TokenStep, ToolUse
from mlxcel.items import (
    FunctionCall,
    Item,
    Message,
    OutputText,
    Reasoning,
    ResponseError,
    ResponseRecord,
    TokenLogprob,
    Usage,
    cancelled,
    failed,
    new_id,
)
from mlxcel.respond.events import (
    CompactionCompleted,
    CompactionStarted,
    ContentPartAdded,
    ContentPartDone,
    OutputItemAdded,
    OutputItemDone,
    OutputTextDelta,
    OutputTextDone,
    ReasoningTextDelta,
    ReasoningTextDone,
    ResponseEvent,
    ResponseInProgress,
    StreamError,
)
from mlxcel.respond.logprobs import TokenTrail
from mlxcel.respond.reasoning import AnswerPiece, Piece, ReasoningPiece, ReasoningSplitter
from mlxcel.respond.stops import StopScanner
from mlxcel.respond.tool_calls import ToolCalls
from mlxcel.respond.tool_parsers import (
    CallClosed,
    CallOpened,
    ParseEvent,
    TextPiece,
    fallback_call,
    make_parser,
)

Status = Literal["completed", "incomplete"]


@dataclasses.dataclass
class _OpenMessage:
    id: str
    index: int
    text: list[str] = dataclasses.field(default_factory=list)
    logprobs: list[TokenLogprob] = dataclasses.field(default_factory=list)


class ResponseBuilder:
    """Turns one response's generated text into Responses items, the stream events that
    announce them, and the final record, in one place, so every wire format and the store
    see the same response."""

    def __init__(
        self,
        record: ResponseRecord,
        prompt_tokens: int,
        tools: ToolUse | None = None,
        *,
        reasoning_opened: bool = False,
        compaction: CompactionReport | None = None,
        stop: Sequence[str] = (),
    ) -> None:
        self._record = dataclasses.replace(record, status="in_progress", output=(), usage=None)
        self._id = record.id  # every event names its response
        self._prompt_tokens = prompt_tokens
        self._tools = tools
        self._parser = make_parser(tools.parser, tools.names, tools.parameters) if tools else None
        self._output: list[Item | None] = []  # None: a slot whose item is still open
        self._message: _OpenMessage | None = None
        self._calls = ToolCalls(record.id, tools, self._output) if tools else None
        self._held: list[str] = []  # text that may still turn out to be a call
        self._held_logprobs: list[TokenLogprob] = []
        self._holding = tools is not None
        self._splitter = ReasoningSplitter(opened=reasoning_opened)
        self._reasoning: _OpenMessage | None = None
        self._tokens = 0
        self._cached_tokens = 0  # prompt tokens reused from the prefix cache
        self._cache_write_tokens = 0  # prompt tokens read and kept by the prefix cache
        self._reasoning_tokens = 0
        self._undecided_tokens = 0  # tokens before the reply shows whether it reasons
        # Log-probabilities of tokens whose text the detokenizer has not released yet.
        self._pending_logprobs: list[TokenLogprob] = []
        self._trail = TokenTrail()  # with tools: the logprobs of the text fed to the parser
        self._stops = StopScanner(stop)
        self._compaction = compaction
        if compaction is not None:  # it leads the output, at index 0
            self._output.append(compaction.item)

    @property
    def record(self) -> ResponseRecord:
        return self._record

    @property
    def generated(self) -> int:
        """The tokens fed so far."""
        return self._tokens

    @property
    def stopped(self) -> bool:
        """The answer reached a stop string: the reply ends here (`finish("stop")`)."""
        return self._stops.found

    def start(self, *, announced: bool = False) -> list[ResponseEvent]:
        """A slot took the response (the HTTP edge already announced it as created).

        `announced`: the slot already sent `response.in_progress` and the start of the
        compaction, before it generated the summary."""
        events: list[ResponseEvent] = [] if announced else [ResponseInProgress(self._record)]
        if self._compaction is not None:
            report = self._compaction
            if not announced:
                events.append(CompactionStarted(self._id, report.tokens_before))
            events += [
                CompactionCompleted(self._id, report.tokens_before, report.tokens_after),
                OutputItemAdded(self._id, 0, report.item),
                OutputItemDone(self._id, 0, report.item),
            ]
        return events

    def feed(self, step: TokenStep) -> list[ResponseEvent]:
        """Events for one generated token (none when it adds no visible output yet)."""
        if self._tokens == 0:
            self._cached_tokens = step.cached_tokens  # set on a sequence's first step
            self._cache_write_tokens = step.cache_write_tokens
        self._tokens += 1
        was_reasoning = self._splitter.reasoning
        tracing = was_reasoning and not self._splitter.undecided
        pieces = self._splitter.feed(step.text) if step.text else []
        answered = any(isinstance(p, AnswerPiece) for p in pieces)
        if self._splitter.undecided:
            self._undecided_tokens += 1  # reasoning only if the reply opens a trace
        elif was_reasoning and not answered:
            self._reasoning_tokens += 1 + self._undecided_tokens
            self._undecided_tokens = 0
        else:
            self._undecided_tokens = 0
        closed = tracing and not self._splitter.reasoning  # this token closed the trace
        if closed:
            self._pending_logprobs.clear()  # tokens held as the start of `</think>`
        layout = not was_reasoning and bool(step.text) and not pieces  # newlines after </think>
        if step.logprob is not None and not layout and (answered or not closed):
            self._pending_logprobs.append(step.logprob)  # until the text it made is released
        return self._pieces(pieces)

    def _pieces(self, pieces: list[Piece]) -> list[ResponseEvent]:
        events: list[ResponseEvent] = []
        for piece in pieces:
            if isinstance(piece, ReasoningPiece):
                self._pending_logprobs.clear()  # reasoning tokens carry no output logprobs
                events += self._reason(piece.text)
                continue
            events += self._close_reasoning()
            events += self._answer(self._stops.feed(piece.text))
        return events

    def _answer(self, text: str) -> list[ResponseEvent]:
        if not text:
            return []  # held back (a stop string may begin), or nothing at all
        logprobs, self._pending_logprobs = tuple(self._pending_logprobs), []
        if self._parser is None:
            return self._text(text, logprobs)
        self._trail.add(text, logprobs)
        return self._parsed(self._parser.feed(text))

    def _reason(self, text: str) -> list[ResponseEvent]:
        events: list[ResponseEvent] = []
        if self._reasoning is None:
            self._reasoning = _OpenMessage(new_id("rs"), len(self._output))
            self._output.append(None)
            item = Reasoning("", id=self._reasoning.id, status="in_progress")
            events.append(OutputItemAdded(self._id, self._reasoning.index, item))
        trace = self._reasoning
        trace.text.append(text)
        events.append(ReasoningTextDelta(self._id, trace.id, trace.index, 0, text))
        return events

    def _close_reasoning(self) -> list[ResponseEvent]:
        open_item, self._reasoning = self._reasoning, None
        if open_item is None:
            return []
        text = "".join(open_item.text)
        item = Reasoning(text, id=open_item.id, status="completed")
        self._output[open_item.index] = item
        return [
            ReasoningTextDone(self._id, open_item.id, open_item.index, 0, text),
            OutputItemDone(self._id, open_item.index, item),
        ]

    def finish(self, reason: FinishReason) -> tuple[list[ResponseEvent], ResponseRecord]:
        """The closing item events and the final record (not yet stored)."""
        status: Status = "completed" if reason == "stop" else "incomplete"
        events = self._pieces(self._splitter.finish())
        events += self._answer(self._stops.finish())
        events += self._close_reasoning()
        if self._parser is not None:
            events += self._parsed(self._parser.finish(cut=reason == "length"))
            events += self._settle_held()
        answered = any(isinstance(i, FunctionCall | Message) for i in self._output)
        if not answered and self._message is None:
            events += self._open_message()
        events += self._close_message(status)
        events += self._calls.close_all() if self._calls else []
        self._record = dataclasses.replace(
            self._record,
            status=status,
            output=tuple(i for i in self._output if i is not None),
            usage=self._usage(),
            incomplete_reason=None if reason == "stop" else "max_output_tokens",
            completed_at=int(time.time()) if reason == "stop" else None,
            stop_sequence=self._stops.matched,
        )
        return events, self._record

    def fail(self, code: str, message: str) -> tuple[list[ResponseEvent], ResponseRecord]:
        """A failed record (partial output is dropped) and the stream's error event."""
        self._record = failed(self._record, ResponseError(code, message), usage=self._usage())
        return [StreamError(self._id, code, message)], self._record

    def cancel(self) -> ResponseRecord:
        """The record as cancelled; a response that already ended is returned unchanged."""
        return self.interrupt("cancelled")[1]

    def interrupt(
        self, status: Literal["cancelled", "incomplete"], *, reason: str | None = None
    ) -> tuple[list[ResponseEvent], ResponseRecord]:
        """Stop before the end (a cancel, a client gone, a shutdown): the open items are
        closed as they stand and kept; held text that may be a call is dropped. A
        response that already ended is returned unchanged, with no events. `reason`
        says why an `incomplete` one stopped."""
        if self._record.status != "in_progress":
            return [], self._record
        events = self._close_reasoning()
        events += self._close_message("incomplete")
        events += self._calls.close_all() if self._calls else []
        output, usage = tuple(i for i in self._output if i is not None), self._usage()
        if status == "cancelled":
            self._record = cancelled(self._record, usage=usage, output=output)
        else:
            self._record = dataclasses.replace(
                self._record, status=status, output=output, usage=usage, incomplete_reason=reason
            )
        return events, self._record

    # --- text and messages -------------------------------------------------------

    def _text(self, text: str, logprobs: tuple[TokenLogprob, ...] = ()) -> list[ResponseEvent]:
        if self._holding:
            self._held.append(text)
            self._held_logprobs += logprobs
            lead = "".join(self._held).lstrip()
            required = self._tools is not None and self._tools.required
            if required or not lead or lead[0] in "{`":
                return []  # may be a bare or fenced JSON call: decided at the end
            self._holding = False
            text, self._held = "".join(self._held), []
            logprobs, self._held_logprobs = tuple(self._held_logprobs), []
        events: list[ResponseEvent] = []
        if self._message is None:
            events += self._open_message()
        message = self._message
        assert message is not None
        message.text.append(text)
        message.logprobs.extend(logprobs)
        events.append(OutputTextDelta(self._id, message.id, message.index, 0, text, logprobs))
        return events

    def _settle_held(self) -> list[ResponseEvent]:
        held, self._held = "".join(self._held), []
        logprobs, self._held_logprobs = tuple(self._held_logprobs), []
        self._holding = False
        if not held:
            return []
        assert self._tools is not None
        assert self._calls is not None
        call = fallback_call(held, self._tools.names - self._tools.held)
        if call is None:
            return self._text(held, logprobs)
        index = self._calls.spare_index()
        events = self._parsed([CallOpened(index, call[0])])
        return events + self._parsed([CallClosed(index, *call)])

    def _open_message(self) -> list[ResponseEvent]:
        message = _OpenMessage(new_id("msg"), len(self._output))
        self._message = message
        self._output.append(None)
        item = Message("assistant", (), id=message.id, status="in_progress")
        return [
            OutputItemAdded(self._id, message.index, item),
            ContentPartAdded(self._id, message.id, message.index, 0, OutputText("")),
        ]

    def _close_message(self, status: Status) -> list[ResponseEvent]:
        message, self._message = self._message, None
        if message is None:
            return []
        text = "".join(message.text)
        part = OutputText(text, tuple(message.logprobs))
        item = Message("assistant", (part,), id=message.id, status=status)
        self._output[message.index] = item
        return [
            OutputTextDone(self._id, message.id, message.index, 0, text),
            ContentPartDone(self._id, message.id, message.index, 0, part),
            OutputItemDone(self._id, message.index, item),
        ]

    # --- function calls ----------------------------------------------------------

    def _parsed(self, parsed: list[ParseEvent]) -> list[ResponseEvent]:
        events: list[ResponseEvent] = []
        assert self._calls is not None
        for event in parsed:
            if isinstance(event, TextPiece):
                events += self._text(event.text, self._trail.take(event.text))
            elif isinstance(event, CallOpened):
                if self._calls.accepts(event.index, event.name):
                    events += self._close_message("completed")
                    events += self._calls.open(event.index, event.name)
            else:
                events += self._calls.parsed(event)
        return events

    def _usage(self) -> Usage:
        return Usage(
            input_tokens=self._prompt_tokens,
            output_tokens=self._tokens,
            cached_tokens=self._cached_tokens,
            cache_write_tokens=self._cache_write_tokens,
            reasoning_tokens=self._reasoning_tokens,
        )
