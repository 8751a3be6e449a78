"""Whatever a model writes, in whatever pieces, no tool-call parser and no response
builder raises, and what they report is well formed.

The text is drawn from every format's markup cut anywhere and shuffled, JSON-ish
fragments, deep nesting and any unicode (lone surrogates and control characters too);
tool schemas may be anything a request can send.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any
from unittest import mock

from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from mlxcel.generation import TokenStep, ToolUse
from mlxcel.items import FunctionCall, RequestEcho, ResponseRecord, new_id
from mlxcel.respond.builder import ResponseBuilder
from mlxcel.respond.events import (
    FunctionCallArgumentsDelta,
    FunctionCallArgumentsDone,
    OutputItemAdded,
    OutputItemDone,
)
from mlxcel.respond.tool_parsers import (
    PARSERS,
    CallArguments,
    CallClosed,
    CallDropped,
    CallOpened,
    ParseEvent,
    TextPiece,
    make_parser,
)

NAMES = frozenset({"get_weather", "f"})
CALLS = {
    "hermes": [
        '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
    ],
    "qwen3_coder": [
        "<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n"
        "<parameter=days>\n3\n</parameter>\n</function>\n</tool_call>",
        '<tool_call>{"name": "f", "arguments": {}}</tool_call>',
    ],
    "mistral": [
        '[TOOL_CALLS]get_weather[ARGS]{"city": "Paris"}',
        '[TOOL_CALLS]f[CALL_ID]a1[ARGS]{"a": [1]}',
        '[TOOL_CALLS][{"name": "f", "arguments": {"x": null}}]',
    ],
    "llama3_json": [
        '{"name": "get_weather", "parameters": {"city": "Paris"}}',
        '<|python_tag|>{"name": "f", "arguments": {}}; {"name": "f", "parameters": {"a": 1}}',
    ],
    "functionary": ['<function=get_weather>{"city": "Paris"}</function>'],
    "pythonic": ['[get_weather(city="Paris"), f(a=[1, {"b": None}])]'],
}
MARKUP = {
    "hermes": ["<tool_call>", "</tool_call>"],
    "qwen3_coder": ["<tool_call>", "</tool_call>", "<function=", "<parameter=", "</parameter>"],
    "mistral": ["[TOOL_CALLS]", "[ARGS]", "[CALL_ID]"],
    "llama3_json": ["<|python_tag|>"],
    "functionary": ["<function=", "</function>"],
    "pythonic": [],  # its markup is Python, which prose may hold too
}
FRAGMENTS = [
    *sorted({f for v in (*CALLS.values(), *MARKUP.values()) for f in v}),
    *'{}[]()":,;=<>`\\',
    '"name"',
    '"arguments"',
    '"parameters"',
    '"get_weather"',
    "get_weather",
    '["f"]',
    "rm_rf",
    "```json\n",
    "```",
    "null",
    "NaN",
    "-Infinity",
    "1e400",
    "9" * 5000,
    '"\\ud800"',
    "\ud800",
    "\udfff",
    "\x00",
    "\x1b",
    "\n",
    " ",
    "[" * 100,
    "{" * 70,
    '{"a": ' * 80,
    "[" * 3000,
    ")" * 10,
    "'",
    '"""',
    "<think>",
    "</think>",
]
EXAMPLES = 200
ANY_CHAR = st.characters(codec=None, exclude_categories=())

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(ANY_CHAR, max_size=5),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3)
    ),
    max_leaves=8,
)
names = st.one_of(st.sampled_from(sorted(NAMES)), st.text(max_size=6), json_values)
arguments = st.one_of(
    json_values.map(lambda v: json.dumps(v, ensure_ascii=False)),
    st.integers(1, 3000).map(lambda n: '{"a": ' + "[" * n + "]" * n + "}"),
    st.integers(1, 200).map(lambda n: '{"a": ' * n + "1" + "}" * n),
    st.sampled_from(['{"a": NaN}', '{"a": 1e400}', '{"a": "\\ud800"}', '"{}"', "{", "}"]),
    st.text(ANY_CHAR, max_size=8),
)


@st.composite
def call_like(draw: st.DrawFn) -> str:
    """A call in one of the formats, with any name and arguments, maybe cut short."""
    name, args = draw(names), draw(arguments)
    bare = name if isinstance(name, str) else json.dumps(name)
    body = f'{{"name": {json.dumps(name)}, "arguments": {args}}}'
    value = draw(st.text(ANY_CHAR, max_size=6) | st.just(args))
    call = draw(
        st.sampled_from(
            [
                f"<tool_call>{body}</tool_call>",
                f"<tool_call>\n<function={bare}>\n<parameter=a>\n{value}\n</parameter>\n"
                f"<parameter=days>{value}</function>\n</tool_call>",
                f"[TOOL_CALLS]{bare}[ARGS]{args}",
                f"[TOOL_CALLS][{body}, {body}]",
                f"<|python_tag|>{body}; {body}",
                body,
                f"```json\n{body}\n```",
                f"<function={bare}>{args}</function>",
                f"[{bare}(a={args}), {bare}(b={value!r})]",
            ]
        )
    )
    end = draw(st.integers(0, len(call)) | st.just(len(call)))
    return call[:end]


text_pieces = st.one_of(
    st.sampled_from(FRAGMENTS), st.text(ANY_CHAR, max_size=8), call_like(), call_like()
)
replies = st.lists(text_pieces, max_size=12).map("".join)
"""Replies of calls and fragments of every format in any order, and any characters."""

type_names = st.sampled_from(["string", "integer", "number", "boolean", "object", "array", "null"])
property_schemas = st.one_of(
    json_values,
    st.fixed_dictionaries({"type": type_names | st.lists(type_names | json_values, max_size=3)}),
    st.fixed_dictionaries(
        {"anyOf": st.lists(st.fixed_dictionaries({"type": type_names}) | json_values)}
    ),
)
tool_schemas = st.one_of(
    json_values,
    st.fixed_dictionaries(
        {
            "type": st.just("object"),
            "properties": json_values
            | st.dictionaries(
                st.sampled_from(["city", "days", "a", "x"]), property_schemas, max_size=4
            ),
        }
    ),
)
schemas = st.one_of(
    st.none(), st.dictionaries(st.sampled_from(sorted(NAMES)), tool_schemas, max_size=2)
)

NOT_A_NAME = ['{"name": ["x"], ', '"arguments": {}}']
DEEP_CALL = ['<tool_call>{"name": "f", "arguments": {"a": ', "[" * 5000, "]" * 5000 + "}}"]
XML_CALL = ["<tool_call><function=f><parameter=a>1</parameter></function></tool_call>"]


@st.composite
def chunked(draw: st.DrawFn, text: str) -> list[str]:
    """`text` cut at random points."""
    cuts = sorted(draw(st.sets(st.integers(0, len(text)), max_size=12)))
    return [text[a:b] for a, b in zip([0, *cuts], [*cuts, len(text)], strict=True)]


def check(events: list[ParseEvent]) -> tuple[str, list[tuple[str, str]]]:
    """The events' text and calls, once checked to be well formed."""
    state: dict[int, str] = {}
    streamed: dict[int, str] = {}
    text, calls = "", []
    for event in events:
        match event:
            case TextPiece(piece):
                assert piece
                text += piece
            case CallOpened(index, name):
                assert index not in state
                assert name in NAMES
                state[index], streamed[index] = name, ""
            case CallArguments(index, delta):
                assert state.get(index) in NAMES
                streamed[index] += delta
            case CallClosed(index, name, arguments):
                assert state.get(index) == name
                assert streamed[index] == arguments  # the deltas add up to the arguments
                assert isinstance(json.loads(arguments), dict)
                state[index] = "closed"
                calls.append((name, arguments))
            case CallDropped(index):
                assert state.get(index) in NAMES
                state[index] = "dropped"
    assert sorted(state) == list(range(len(state)))
    assert all(s in ("closed", "dropped") for s in state.values())
    return text, calls


@settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.sampled_from(sorted(PARSERS)), replies.flatmap(chunked), schemas)
@example("llama3_json", ["".join(NOT_A_NAME)], None)
@example("mistral", [f"[TOOL_CALLS][{''.join(NOT_A_NAME)}]"], None)
@example("hermes", DEEP_CALL, None)
@example("qwen3_coder", XML_CALL, {"f": ["a"]})
def test_any_reply_through_any_parser(kind: str, chunks: list[str], tools: Any) -> None:
    parser = make_parser(kind, NAMES, tools)
    events = [e for chunk in chunks for e in parser.feed(chunk)] + parser.finish()
    text, calls = check(events)
    assert text == parser.text
    if encodable("".join(chunks)):
        for _, arguments in calls:
            assert encodable(arguments)


def encodable(text: str) -> bool:
    try:
        text.encode()
    except UnicodeEncodeError:
        return False
    return True


@st.composite
def well_formed(draw: st.DrawFn, kind: str) -> str:
    """Prose without markup around the format's own calls."""
    prose = st.text(st.characters(codec="utf-8", exclude_characters="<>[]{}()`|"), max_size=12)
    parts = draw(st.lists(st.sampled_from(CALLS[kind]) | prose, max_size=5))
    return " ".join(parts)


def record() -> ResponseRecord:
    return ResponseRecord(new_id("resp"), 0, "queued", RequestEcho(model="m"))


@dataclass(frozen=True)
class Reply:
    kind: str | None
    """The tool-call format, None without tools."""
    chunks: list[str]
    well: bool = False
    """Only prose and calls in the format."""
    reasoning: bool = False
    """The template opened a reasoning trace."""


@st.composite
def builder_replies(draw: st.DrawFn) -> Reply:
    kind = draw(st.sampled_from([None, *sorted(PARSERS)]))
    well = kind is not None and draw(st.booleans())
    reply = draw(well_formed(kind) if kind is not None and well else call_like() | replies)
    reasoning = draw(st.booleans())
    if reasoning:  # the trace may end before the answer
        reply = draw(st.sampled_from(["", "hm</think>", "</think>\n"])) + reply
    return Reply(kind, draw(chunked(reply)), well, reasoning)


@settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    builder_replies(),
    st.booleans(),
    st.booleans(),
    st.sampled_from(["stop", "length"]),
    schemas,
)
@example(Reply("hermes", NOT_A_NAME), False, True, "stop", None)
@example(Reply("llama3_json", NOT_A_NAME), True, False, "stop", None)
@example(Reply("hermes", DEEP_CALL), False, True, "length", None)
@example(Reply("qwen3_coder", XML_CALL), False, True, "stop", {"f": "x"})
def test_any_reply_through_a_response_builder(
    reply: Reply, required: bool, parallel: bool, reason: Any, tools: Any
) -> None:
    kind, chunks, reasoning = reply.kind, reply.chunks, reply.reasoning
    use = ToolUse(NAMES, required, kind, parallel, tools or {}) if kind else None
    builder = ResponseBuilder(record(), 5, use, reasoning_opened=reasoning)
    events = builder.start()
    for i, chunk in enumerate(chunks):
        events += builder.feed(TokenStep(1, i, chunk))
    done, final = builder.finish(reason)
    events += done
    assert final.status == ("completed" if reason == "stop" else "incomplete")
    added = [e.output_index for e in events if isinstance(e, OutputItemAdded)]
    assert sorted(added) == sorted(e.output_index for e in events if isinstance(e, OutputItemDone))
    assert len(added) == len(set(added))
    calls = [i for i in final.output if isinstance(i, FunctionCall)]
    assert kind is not None or not calls
    assert parallel or len(calls) <= 1
    for call in calls:
        assert isinstance(call.name, str)
        assert call.name in NAMES
        assert isinstance(json.loads(call.arguments), dict)
        assert call.status == "completed"
        deltas = "".join(
            e.delta
            for e in events
            if isinstance(e, FunctionCallArgumentsDelta) and e.item_id == call.id
        )
        done_events = [
            e for e in events if isinstance(e, FunctionCallArgumentsDone) and e.item_id == call.id
        ]
        assert [e.arguments for e in done_events] == [deltas] == [call.arguments]
    if reply.well and kind is not None:
        assert not any(t in final.output_text for t in MARKUP[kind])
    assert builder.cancel() == final


class ScriptedParser:
    """Reports the next scripted batch of events for each piece of text it is fed."""

    def __init__(self, batches: list[list[ParseEvent]]) -> None:
        self._batches = batches

    def feed(self, text: str) -> list[ParseEvent]:
        return self._batches.pop(0) if self._batches else []

    def finish(self, *, cut: bool = False) -> list[ParseEvent]:
        rest, self._batches = [e for b in self._batches for e in b], []
        return rest


indices = st.integers(-2, 3)
parse_events = st.one_of(
    st.builds(TextPiece, st.text(max_size=3)),
    st.builds(CallOpened, indices, st.sampled_from([*sorted(NAMES), "rm_rf"])),
    st.builds(CallArguments, indices, st.sampled_from(["", "{", "}", '"a": 1'])),
    st.builds(CallClosed, indices, st.sampled_from(sorted(NAMES)), st.just("{}")),
    st.builds(CallDropped, indices),
)


@settings(max_examples=EXAMPLES, deadline=None)
@given(
    st.lists(st.lists(parse_events, max_size=4), max_size=6),
    st.booleans(),
    st.booleans(),
    st.sampled_from(["stop", "length"]),
)
def test_any_parser_events_through_a_response_builder(
    batches: list[list[ParseEvent]], required: bool, parallel: bool, reason: Any
) -> None:
    scripted = {"scripted": lambda names, schemas: ScriptedParser(list(batches))}
    with mock.patch.dict(PARSERS, scripted):
        use = ToolUse(NAMES, required, "scripted", parallel)
        builder = ResponseBuilder(record(), 5, use)
        events = builder.start()
        for i in range(len(batches)):
            events += builder.feed(TokenStep(1, i, "x"))
        done, final = builder.finish(reason)
    added = [e.output_index for e in events + done if isinstance(e, OutputItemAdded)]
    assert sorted(added) == sorted(
        e.output_index for e in events + done if isinstance(e, OutputItemDone)
    )
    calls = [i for i in final.output if isinstance(i, FunctionCall)]
    assert all(c.name in NAMES and c.status == "completed" for c in calls)
    assert parallel or len(calls) <= 1
    assert builder.fail("x", "y")[1].status == "failed"
