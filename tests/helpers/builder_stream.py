"""Replaying a response builder's stream against the Responses grammar, and the
builders and pieces the builder tests share."""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Sequence

from mlxcel.generation import TokenStep, ToolUse
from mlxcel.items import (
    Compaction,
    FunctionCall,
    Item,
    Message,
    OutputText,
    Reasoning,
    RequestEcho,
    ResponseRecord,
    TokenLogprob,
    new_id,
)
from mlxcel.respond.builder import ResponseBuilder
from mlxcel.respond.events import (
    ContentPartAdded,
    ContentPartDone,
    FunctionCallArgumentsDelta,
    FunctionCallArgumentsDone,
    OutputItemAdded,
    OutputItemDone,
    OutputTextDelta,
    OutputTextDone,
    ReasoningTextDelta,
    ReasoningTextDone,
    ResponseEvent,
)
from mlxcel.respond.tool_parsers import ParseEvent


@dataclasses.dataclass
class Streamed:
    """One output item as its events told it."""

    added: Item
    kinds: list[str] = dataclasses.field(default_factory=list)
    text: str = ""  # its text, reasoning or argument deltas, joined
    logprobs: list[TokenLogprob] = dataclasses.field(default_factory=list)
    done: Item | None = None


_GRAMMAR = {
    Message: "added part_added (delta )*text_done part_done done",
    Reasoning: "added (delta )*text_done done",
    FunctionCall: "added (delta )*text_done done",
    Compaction: "added done",
}


def replay(events: Sequence[ResponseEvent]) -> list[Streamed]:
    """The items a stream describes, by output index, checked against the grammar."""
    items: list[Streamed] = []
    assert len({e.response_id for e in events}) <= 1, "every event names the one response"

    def at(index: int, item_id: str | None, kind: str) -> Streamed:
        assert 0 <= index < len(items), f"{kind} for output index {index} before it was added"
        item = items[index]
        assert item.done is None, f"{kind} for output index {index} after it was done"
        assert item_id is None or item_id == item.added.id
        item.kinds.append(kind)
        return item

    for event in events:
        match event:
            case OutputItemAdded(_, index, added):
                assert index == len(items), "a new item takes the next output index"
                assert added.id is not None
                assert getattr(added, "status", "in_progress") == "in_progress"
                items.append(Streamed(added, ["added"]))
            case ContentPartAdded(_, item_id, index, content_index, part):
                at(index, item_id, "part_added")
                assert (content_index, part) == (0, OutputText(""))
            case OutputTextDelta(_, item_id, index, content_index, delta, logprobs):
                item = at(index, item_id, "delta")
                assert content_index == 0
                item.text += delta
                item.logprobs += logprobs
            case ReasoningTextDelta(_, item_id, index, content_index, delta):
                item = at(index, item_id, "delta")
                assert content_index == 0
                item.text += delta
            case FunctionCallArgumentsDelta(_, item_id, index, delta):
                at(index, item_id, "delta").text += delta
            case OutputTextDone(_, item_id, index, _, text) | ReasoningTextDone(
                _, item_id, index, _, text
            ):
                assert at(index, item_id, "text_done").text == text
            case FunctionCallArgumentsDone(_, item_id, index, arguments):
                assert at(index, item_id, "text_done").text == arguments
            case ContentPartDone(_, item_id, index, _, part):
                item = at(index, item_id, "part_done")
                assert part == OutputText(item.text, tuple(item.logprobs))
            case OutputItemDone(_, index, done):
                item = at(index, done.id, "done")
                assert type(done) is type(item.added)
                assert re.fullmatch(_GRAMMAR[type(done)], " ".join(item.kinds)), item.kinds
                item.done = done
    for index, item in enumerate(items):
        assert item.done is not None, f"output index {index} was never done"
        match item.done:
            case Message(content=content, status=status):
                assert content == (OutputText(item.text, tuple(item.logprobs)),)
                assert status != "in_progress"
            case Reasoning(text=text, status=status):
                assert text == item.text
                assert status != "in_progress"
            case FunctionCall(arguments=arguments, status=status):
                assert isinstance(item.added, FunctionCall)
                assert arguments == item.text
                assert (item.done.call_id, item.done.name) == (
                    item.added.call_id,
                    item.added.name,
                )
                assert status != "in_progress"
    return items


def kept(items: list[Streamed], record: ResponseRecord) -> None:
    """The record's output is the streamed items as they were done, in stream order
    (an item the record leaves out is named by the test that expects it)."""
    done = [i.done for i in items]
    assert all(i in done for i in record.output)
    assert [done.index(i) for i in record.output] == sorted(done.index(i) for i in record.output)


def statuses(items: list[Streamed]) -> list[tuple[type, str]]:
    """Each streamed item's kind and the status it was done with."""
    return [(type(i.done), getattr(i.done, "status", "")) for i in items]


def plain(*, reasoning_opened: bool = False, tools: ToolUse | None = None) -> ResponseBuilder:
    record = ResponseRecord(new_id("resp"), 0, "queued", RequestEcho(model="m"))
    return ResponseBuilder(record, 7, tools, reasoning_opened=reasoning_opened)


def feed(b: ResponseBuilder, pieces: Sequence[str | TokenStep]) -> list[ResponseEvent]:
    events: list[ResponseEvent] = []
    for i, piece in enumerate(pieces):
        events += b.feed(TokenStep(1, i, piece) if isinstance(piece, str) else piece)
    return events


def hermes(*, parallel: bool = True) -> ToolUse:
    return ToolUse(NAMES, False, parser="hermes", parallel=parallel)


HI = "Hi "
F_CALL = ['<tool_call>{"name": "f", "arguments": {"a": 1', "}}</tool_call>"]
G_CALL = ['<tool_call>{"name": "g", "arguments": {"b":', " 2}}</tool_call>"]


def lp(token: str, value: float) -> TokenLogprob:
    return TokenLogprob(token, value, ((token, value), ("x", value - 1)))


NAMES = frozenset({"f", "g"})


class ScriptedParser:
    """Reports the next scripted batch of events for each piece of text it is fed."""

    def __init__(self, batches: Sequence[Sequence[ParseEvent]]) -> None:
        self._batches = list(batches)

    def feed(self, text: str) -> list[ParseEvent]:
        return list(self._batches.pop(0)) if self._batches else []

    def finish(self, *, cut: bool = False) -> list[ParseEvent]:
        rest = [e for batch in self._batches for e in batch]
        self._batches = []
        return rest

    @property
    def text(self) -> str:
        return ""


Script = list[list[ParseEvent]]


def builder(
    *, kind: str = "scripted", required: bool = False, parallel: bool = True
) -> ResponseBuilder:
    record = ResponseRecord(new_id("resp"), 0, "queued", RequestEcho(model="m"))
    tools = ToolUse(NAMES, required, parser=kind, parallel=parallel)
    return ResponseBuilder(record, 3, tools)
