"""The response builder: function calls, parallel or not, bare or namespaced, streamed
as items of their own (checked with `replay`)."""

from __future__ import annotations

import json

from mlxcel.generation import ToolUse
from mlxcel.items import (
    FunctionCall,
    Message,
    Usage,
)
from mlxcel.respond.events import OutputItemAdded, OutputItemDone
from mlxcel.respond.tool_parsers import (
    CallArguments,
    CallClosed,
    CallDropped,
    CallOpened,
    TextPiece,
)

from builder_stream import (
    F_CALL,
    G_CALL,
    HI,
    Script,
    builder,
    feed,
    hermes,
    kept,
    plain,
    replay,
    statuses,
)

# --- function calls --------------------------------------------------------------


def test_two_parallel_calls_stream_as_two_items_after_the_text() -> None:
    b = plain(tools=hermes())
    events = feed(b, [HI, *F_CALL, *G_CALL])
    closing, record = b.finish("stop")
    rid = record.id
    items = replay(events + closing)
    assert [type(i.done) for i in items] == [Message, FunctionCall, FunctionCall]
    assert items[0].text == HI
    # The message is done before the first call is added.
    message_done = next(i for i, e in enumerate(events) if isinstance(e, OutputItemDone))
    assert events[message_done + 1] == OutputItemAdded(rid, 1, items[1].added)
    calls = record.output[1:]
    assert [(c.name, json.loads(c.arguments)) for c in calls if isinstance(c, FunctionCall)] == [
        ("f", {"a": 1}),
        ("g", {"b": 2}),
    ]
    assert all(isinstance(c, FunctionCall) and c.status == "completed" for c in calls)
    ids = [(c.id, c.call_id) for c in calls if isinstance(c, FunctionCall)]
    assert len({x for pair in ids for x in pair}) == 4
    assert all(i and i.startswith("fc_") and c.startswith("call_") for i, c in ids)
    # The arguments stream while generated: more than one delta for each call.
    assert [i.kinds.count("delta") for i in items[1:]] == [2, 2]
    assert record.status == "completed"
    kept(items, record)
    assert record.output == tuple(i.done for i in items)


def test_parallel_tool_calls_false_keeps_only_the_first_call() -> None:
    b = plain(tools=hermes(parallel=False))
    events = feed(b, [HI, *F_CALL, *G_CALL])
    closing, record = b.finish("stop")
    items = replay(events + closing)
    assert [type(i.done) for i in items] == [Message, FunctionCall]
    assert [c.name for c in record.output if isinstance(c, FunctionCall)] == ["f"]
    # Nothing of the second call reaches the stream, not even as text.
    assert all("b" not in i.text for i in items)
    assert record.output_text == HI
    assert record.usage == Usage(7, 5)


def test_parallel_tool_calls_false_a_dropped_call_does_not_use_up_the_turn(
    script: Script,
) -> None:
    script[:] = [
        [CallOpened(0, "f"), CallArguments(0, "{")],
        [CallDropped(0), TextPiece("<bad>")],
        [CallOpened(1, "g"), CallArguments(1, "{}"), CallClosed(1, "g", "{}")],
    ]
    b = builder(parallel=False)
    events = b.start() + feed(b, ["a", "b", "c"])
    closing, record = b.finish("stop")
    items = replay(events + closing)
    assert statuses(items) == [
        (FunctionCall, "incomplete"),
        (Message, "completed"),
        (FunctionCall, "completed"),
    ]
    # The dropped call's text is the message; the call after it is the turn's call.
    assert [type(i) for i in record.output] == [Message, FunctionCall]
    assert record.output_text == "<bad>"
    kept(items, record)


def test_a_bare_json_reply_is_held_back_and_becomes_a_call_at_the_end() -> None:
    b = plain(tools=hermes())
    events = feed(b, ['{"name": "g",', ' "arguments": {"b": 2}}'])
    assert events == []  # it may be a call: nothing streams before the end decides
    closing, record = b.finish("stop")
    [item] = replay(closing)
    assert isinstance(item.done, FunctionCall)
    assert (item.done.name, json.loads(item.done.arguments)) == ("g", {"b": 2})
    assert record.output == (item.done,)


def test_a_namespaced_call_is_split_back_into_namespace_and_name() -> None:
    tools = ToolUse(
        frozenset({"crm__lookup"}), False, namespaces={"crm__lookup": ("crm", "lookup")}
    )
    b = plain(tools=tools)
    events = feed(b, ['<tool_call>{"name": "crm__lookup", "arguments": {}}</tool_call>'])
    closing, record = b.finish("stop")
    [item] = replay(events + closing)
    assert isinstance(item.added, FunctionCall)
    assert (item.added.namespace, item.added.name) == ("crm", "lookup")
    assert record.output == (item.done,)


def test_finish_closes_a_call_the_parser_left_open_with_the_arguments_streamed(
    script: Script,
) -> None:
    script[:] = [[CallOpened(0, "f"), CallArguments(0, '{"a": ')]]
    b = builder()
    events = b.start() + feed(b, ["x"])
    closing, record = b.finish("length")
    items = replay(events + closing)  # the call is done with '{"a": ', what its deltas said
    assert statuses(items) == [(FunctionCall, "incomplete"), (Message, "incomplete")]
    assert isinstance(items[0].done, FunctionCall)
    assert items[0].done.arguments == '{"a": '
    # A reply whose call did not complete still answers with a (here empty) message.
    assert record.output == (items[1].done,)
    assert record.status == "incomplete"
