"""The response builder: token steps and parser events in; items, stream events and
the final record out.

The stream is checked against the Responses grammar (`replay`): each item is added at
the next output index, its parts and deltas nest inside it, and it is done exactly
once, with the text or arguments its deltas add up to.

A scripted parser stands in for a real one, to send events out of order: arguments or
an end for a call never opened, a call opened twice, events after its end; the builder
takes whatever a tool-call parser reports without raising."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Sequence
from unittest import mock

import pytest

from mlxcel.generation import CompactionReport, TokenStep
from mlxcel.items import (
    Compaction,
    FunctionCall,
    Message,
    OutputText,
    Reasoning,
    RequestEcho,
    ResponseRecord,
    Usage,
    new_id,
)
from mlxcel.respond.builder import ResponseBuilder
from mlxcel.respond.events import (
    CompactionCompleted,
    CompactionStarted,
    ContentPartAdded,
    ContentPartDone,
    FunctionCallArgumentsDone,
    OutputItemAdded,
    OutputItemDone,
    OutputTextDelta,
    OutputTextDone,
    ReasoningTextDelta,
    ResponseEvent,
    ResponseInProgress,
    StreamError,
)
from mlxcel.respond.tool_parsers import (
    CallArguments,
    CallClosed,
    CallDropped,
    CallOpened,
    ParseEvent,
)

from builder_stream import (
    F_CALL,
    HI,
    NAMES,
    Script,
    builder,
    feed,
    hermes,
    plain,
    replay,
)


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


# --- text and reasoning ----------------------------------------------------------


def test_plain_text_streams_one_message_part_by_part() -> None:
    b = plain()
    with mock.patch("mlxcel.respond.builder.time") as clock:
        clock.time.return_value = 1_700_000_123.9
        events = b.start() + feed(b, ["Hel", "lo", " wörld"])
        closing, record = b.finish("stop")
    rid = record.id
    assert isinstance(events[1], OutputItemAdded)
    msg = events[1].item.id
    assert msg is not None
    assert msg.startswith("msg_")
    text = "Hello wörld"
    final = Message("assistant", (OutputText(text),), id=msg, status="completed")
    assert events + closing == [
        ResponseInProgress(
            dataclasses.replace(
                record, status="in_progress", output=(), usage=None, completed_at=None
            )
        ),
        OutputItemAdded(rid, 0, Message("assistant", (), id=msg, status="in_progress")),
        ContentPartAdded(rid, msg, 0, 0, OutputText("")),
        OutputTextDelta(rid, msg, 0, 0, "Hel"),
        OutputTextDelta(rid, msg, 0, 0, "lo"),
        OutputTextDelta(rid, msg, 0, 0, " wörld"),
        OutputTextDone(rid, msg, 0, 0, text),
        ContentPartDone(rid, msg, 0, 0, OutputText(text)),
        OutputItemDone(rid, 0, final),
    ]
    assert record.status == "completed"
    assert record.output == (final,)
    assert record.output_text == text
    assert record.usage == Usage(input_tokens=7, output_tokens=3)
    assert record.incomplete_reason is None
    assert record.completed_at == 1_700_000_123
    assert b.record == record


def test_the_in_progress_event_carries_the_record_as_created() -> None:
    record = ResponseRecord(new_id("resp"), 42, "queued", RequestEcho(model="m"), store=False)
    [event] = ResponseBuilder(record, 1).start()
    assert event == ResponseInProgress(dataclasses.replace(record, status="in_progress"))


def test_every_event_names_the_response_it_belongs_to() -> None:
    record = ResponseRecord(new_id("resp"), 0, "queued", RequestEcho(model="m"))
    report = CompactionReport(Compaction("summary", id=new_id("cmp")), 900, 120)

    def builder() -> ResponseBuilder:
        return ResponseBuilder(record, 7, hermes(), reasoning_opened=True, compaction=report)

    finished = builder()
    events = finished.start() + feed(finished, ["plan", "</think>", HI, *F_CALL, "tail"])
    events += finished.finish("length")[0]
    interrupted = builder()
    events += interrupted.start() + feed(interrupted, ["plan", "</think>", HI, F_CALL[0]])
    events += interrupted.interrupt("incomplete", reason="server_shutdown")[0]
    events += builder().fail("server_error", "boom")[0]
    kinds = {type(e) for e in events}
    assert {CompactionStarted, ReasoningTextDelta, OutputTextDelta, StreamError} <= kinds
    assert {FunctionCallArgumentsDone, ContentPartDone, OutputItemDone} <= kinds
    assert {e.response_id for e in events} == {record.id}


@pytest.mark.parametrize("opened", [False, True])
def test_reasoning_is_an_item_of_its_own_before_the_message(opened: bool) -> None:
    b = plain(reasoning_opened=opened)
    pieces = ([] if opened else ["<think>"]) + ["plan", " ahead", "</think>", "\n\n", "Answer"]
    events = feed(b, pieces)
    closing, record = b.finish("stop")
    items = replay(events + closing)
    assert [type(i.done) for i in items] == [Reasoning, Message]
    assert items[0].kinds == ["added", "delta", "delta", "text_done", "done"]
    assert items[1].kinds == ["added", "part_added", "delta", "text_done", "part_done", "done"]
    # The trace is done before the answer starts: the message's first event follows it.
    first_message_event = events.index(next(e for e in events if isinstance(e, ContentPartAdded)))
    assert isinstance(events[first_message_event - 2], OutputItemDone)
    rs, msg = record.output
    assert rs == Reasoning("plan ahead", id=items[0].added.id, status="completed")
    assert isinstance(msg, Message)
    assert msg.text == "Answer"
    assert rs.id is not None
    assert rs.id.startswith("rs_")
    assert rs.id != msg.id
    # Every token up to and including `</think>` is a reasoning token; the layout newlines
    # after it count as neither (they are dropped), the answer's token as output only.
    reasoning = len(pieces) - 2
    assert record.usage == Usage(7, len(pieces), 0, reasoning)


def test_a_reply_that_is_only_reasoning_still_ends_with_a_message() -> None:
    b = plain(reasoning_opened=True)
    events = feed(b, ["just", " thinking"])
    closing, record = b.finish("length")
    items = replay(events + closing)
    assert [type(i.done) for i in items] == [Reasoning, Message]
    assert record.output_text == ""
    assert isinstance(record.output[1], Message)
    assert record.output[1].status == "incomplete"


def test_a_reply_with_no_text_at_all_is_one_empty_message() -> None:
    b = plain()
    events = feed(b, ["", ""])
    closing, record = b.finish("stop")
    [item] = replay(events + closing)
    assert item.kinds == ["added", "part_added", "text_done", "part_done", "done"]
    assert record.output == (item.done,)
    assert record.output_text == ""
    assert record.usage is not None
    assert record.usage.output_tokens == 2


# --- compaction ------------------------------------------------------------------


def test_a_compaction_leads_the_output_and_the_reply_follows_it() -> None:
    record = ResponseRecord(new_id("resp"), 0, "queued", RequestEcho(model="m"))
    compaction = Compaction("summary", id=new_id("cmp"))
    report = CompactionReport(compaction, tokens_before=900, tokens_after=120)
    b = ResponseBuilder(record, 120, compaction=report)
    events = b.start()
    assert events[1:] == [
        CompactionStarted(record.id, 900),
        CompactionCompleted(record.id, 900, 120),
        OutputItemAdded(record.id, 0, compaction),
        OutputItemDone(record.id, 0, compaction),
    ]
    events += feed(b, ["ok"])
    closing, final = b.finish("stop")
    items = replay(events + closing)
    assert [type(i.done) for i in items] == [Compaction, Message]
    assert final.output == (compaction, items[1].done)
