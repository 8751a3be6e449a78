"""The response builder takes whatever a tool-call parser reports without raising.

A scripted parser stands in for a real one, to send events out of order: arguments or
an end for a call never opened, a call opened twice, events after its end."""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from unittest import mock

import pytest

from mlxcel.actors.messages import OutputItemAdded, OutputItemDone, ResponseEvent
from mlxcel.actors.responses import ResponseBuilder
from mlxcel.generation import TokenStep, ToolUse
from mlxcel.items import FunctionCall, RequestEcho, ResponseRecord, new_id
from mlxcel.model.tool_parsers import (
    PARSERS,
    CallArguments,
    CallClosed,
    CallDropped,
    CallOpened,
    ParseEvent,
)

NAMES = frozenset({"f", "g"})


class ScriptedParser:
    """Reports the next scripted batch of events for each piece of text it is fed."""

    def __init__(self, batches: Sequence[Sequence[ParseEvent]]) -> None:
        self._batches = list(batches)

    def feed(self, text: str) -> list[ParseEvent]:
        return list(self._batches.pop(0)) if self._batches else []

    def finish(self) -> list[ParseEvent]:
        rest = [e for batch in self._batches for e in batch]
        self._batches = []
        return rest

    @property
    def text(self) -> str:
        return ""


Script = list[list[ParseEvent]]


@pytest.fixture
def script() -> Iterator[Script]:
    """The batches the `scripted` tool-call format's parser reports (fill it in)."""
    batches: Script = []
    with mock.patch.dict(PARSERS, {"scripted": lambda names, schemas: ScriptedParser(batches)}):
        yield batches


def builder(
    *, kind: str = "scripted", required: bool = False, parallel: bool = True
) -> ResponseBuilder:
    record = ResponseRecord(new_id("resp"), 0, "queued", RequestEcho(model="m"))
    tools = ToolUse(NAMES, required, parser=kind, parallel=parallel)
    return ResponseBuilder(record, 3, tools)


def run(b: ResponseBuilder, pieces: Sequence[str]) -> tuple[list[ResponseEvent], ResponseRecord]:
    events = b.start()
    for i, text in enumerate(pieces):
        events += b.feed(TokenStep(1, i, text))
    done, record = b.finish("stop")
    return events + done, record


def check(events: list[ResponseEvent], record: ResponseRecord) -> list[FunctionCall]:
    """Every item added is done once, and the record's calls are to offered tools."""
    added = [e.output_index for e in events if isinstance(e, OutputItemAdded)]
    done = [e.output_index for e in events if isinstance(e, OutputItemDone)]
    assert sorted(added) == sorted(done) == sorted(set(added))
    assert record.status == "completed"
    found = [i for i in record.output if isinstance(i, FunctionCall)]
    for call in found:
        assert call.name in NAMES
        assert isinstance(call.arguments, str)
        assert call.status == "completed"
    return found


@pytest.mark.parametrize(
    ("events", "made"),
    [
        ([CallArguments(0, "{}")], 0),  # arguments for a call never opened
        ([CallClosed(0, "f", "{}")], 0),  # an end for a call never opened
        ([CallDropped(3)], 0),  # a drop for a call never opened
        ([CallOpened(0, "f"), CallClosed(0, "f", "{}"), CallArguments(0, "x")], 1),
        ([CallOpened(0, "f"), CallDropped(0), CallClosed(0, "f", "{}")], 0),
        ([CallOpened(0, "f"), CallClosed(0, "f", "{}"), CallDropped(0)], 1),
        ([CallOpened(0, "f"), CallClosed(0, "f", "{}"), CallClosed(0, "f", "{}")], 1),
    ],
)
def test_events_for_calls_not_open_are_ignored(
    script: Script, events: list[ParseEvent], made: int
) -> None:
    script[:] = [events]
    stream, record = run(builder(), ["x"])
    assert len(check(stream, record)) == made


def test_a_call_opened_twice_is_one_call(script: Script) -> None:
    script[:] = [
        [CallOpened(0, "f"), CallArguments(0, "{")],
        [CallOpened(0, "g"), CallArguments(0, "}")],
        [CallClosed(0, "f", "{}")],
    ]
    events, record = run(builder(), ["a", "b", "c"])
    calls = check(events, record)
    assert [(c.name, c.arguments) for c in calls] == [("f", "{}")]


def test_a_call_to_a_tool_not_offered_is_not_shown(script: Script) -> None:
    script[:] = [[CallOpened(0, "rm"), CallArguments(0, "{}"), CallClosed(0, "rm", "{}")]]
    events, record = run(builder(), ["a"])
    assert check(events, record) == []


def test_a_bare_call_with_a_name_that_is_not_a_string_stays_text() -> None:
    reply = '{"name": ["f"], "arguments": {}}'
    events, record = run(builder(kind="hermes"), [reply[:7], reply[7:]])
    assert check(events, record) == []
    assert record.output_text == reply


@pytest.mark.parametrize("required", [False, True])
def test_a_deeply_nested_bare_reply_stays_text(required: bool) -> None:
    reply = '{"name": "f", "arguments": ' + "[" * 5000
    events, record = run(builder(kind="hermes", required=required), list(reply))
    assert check(events, record) == []
    assert record.output_text == reply
    assert json.loads(json.dumps(record.output_text)) == reply
