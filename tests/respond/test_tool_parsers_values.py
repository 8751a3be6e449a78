"""Format details: typed XML values, pythonic literals, and when calls open and stream."""

from __future__ import annotations

import json
from typing import Any

import pytest

from mlxcel.respond.tool_parsers import (
    CallArguments,
    CallClosed,
    CallDropped,
    CallOpened,
    ParseEvent,
    TextPiece,
    make_parser,
)

SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "text": {"type": "string"},
        "count": {"type": "integer"},
        "ratio": {"type": "number"},
        "flag": {"type": "boolean"},
        "options": {"type": "object"},
        "items": {"type": "array"},
        "maybe": {"type": ["integer", "null"]},
        "either": {"anyOf": [{"type": "string"}, {"type": "null"}]},
    },
}


def feed(kind: str, chunks: list[str], schemas: dict[str, Any] | None = None) -> list[ParseEvent]:
    parser = make_parser(kind, frozenset({"f", "g"}), schemas)
    events = [e for chunk in chunks for e in parser.feed(chunk)]
    return events + parser.finish()


def closed(events: list[ParseEvent]) -> list[tuple[str, Any]]:
    return [(e.name, json.loads(e.arguments)) for e in events if isinstance(e, CallClosed)]


def xml(*parameters: tuple[str, str], name: str = "f") -> str:
    body = "".join(f"<parameter={k}>\n{v}\n</parameter>\n" for k, v in parameters)
    return f"<tool_call>\n<function={name}>\n{body}</function>\n</tool_call>"


@pytest.mark.parametrize(
    ("key", "raw", "value"),
    [
        ("text", "Paris", "Paris"),
        ("text", "42", "42"),
        ("text", "\n  indented\n", "\n  indented\n"),  # only one newline each side is layout
        ("text", "null", "null"),
        ("count", "3", 3),
        ("count", " 7 ", 7),
        ("count", "three", "three"),  # not JSON: the text
        ("ratio", "2.5", 2.5),
        ("ratio", "NaN", "NaN"),  # not a JSON number
        ("flag", "true", True),
        ("options", '{"a": [1, 2]}', {"a": [1, 2]}),
        ("items", '["x", "y"]', ["x", "y"]),
        ("items", "[unclosed", "[unclosed"),
        ("maybe", "null", None),
        ("maybe", "5", 5),
        ("either", "null", None),
        ("either", "5", "5"),
        ("undeclared", "5", "5"),  # no schema for it: the text
    ],
)
def test_qwen3_coder_values_follow_the_schema(key: str, raw: str, value: Any) -> None:
    events = feed("qwen3_coder", [xml((key, raw))], {"f": SCHEMA})
    assert closed(events) == [("f", {key: value})]


def test_qwen3_coder_without_schemas_keeps_text() -> None:
    assert closed(feed("qwen3_coder", [xml(("count", "3"))])) == [("f", {"count": "3"})]


def test_qwen3_coder_streams_each_parameter_as_it_completes() -> None:
    output = xml(("text", "a\nb"), ("count", "2"))
    events = feed("qwen3_coder", output.splitlines(keepends=True), {"f": SCHEMA})
    deltas = [e.delta for e in events if isinstance(e, CallArguments)]
    assert deltas == ['{"text": "a\\nb"', ', "count": 2', "}"]
    assert closed(events) == [("f", {"text": "a\nb", "count": 2})]
    assert isinstance(events[0], CallOpened)


def test_qwen3_coder_tolerates_missing_closing_tags_before_the_call_ends() -> None:
    output = "<tool_call>\n<function=f>\n<parameter=text>\nx\n<parameter=count>\n4\n</tool_call>"
    assert closed(feed("qwen3_coder", [output], {"f": SCHEMA})) == [
        ("f", {"text": "x", "count": 4})
    ]


def test_qwen3_coder_cut_off_before_its_function_closes_is_text() -> None:
    output = "<tool_call>\n<function=f>\n<parameter=text>\nx\n</parameter>\n"
    events = feed("qwen3_coder", [output[:30], output[30:]], {"f": SCHEMA})
    assert closed(events) == []
    assert [type(e) for e in events] == [CallOpened, CallArguments, CallDropped, TextPiece]
    assert "".join(e.text for e in events if isinstance(e, TextPiece)) == output


@pytest.mark.parametrize(
    ("call", "arguments"),
    [
        ("f()", {}),
        ("f(a=-1.5, b=None, c=True)", {"a": -1.5, "b": None, "c": True}),
        ("f(a=(1, 2), b={'k': [1, 'x']})", {"a": [1, 2], "b": {"k": [1, "x"]}}),
        ("f(a='''multi\nline''')", {"a": "multi\nline"}),
    ],
)
def test_pythonic_literals(call: str, arguments: dict[str, Any]) -> None:
    assert closed(feed("pythonic", [f"[{call}]"])) == [("f", arguments)]


@pytest.mark.parametrize(
    "output",
    [
        "[f(a={1, 2})]",  # a set is no JSON
        "[f(a=1e999)]",  # nor is infinity
        "[f(**kw)]",
        "[f(a=x)]",
        "[f(a=1), 2]",
        "[f.g(a=1)]",
        "[f(a=1)",
    ],
)
def test_pythonic_that_is_not_literal_calls_is_text(output: str) -> None:
    events = feed("pythonic", [output])
    assert events == [TextPiece(output)]


def test_pythonic_holds_only_what_may_become_a_call() -> None:
    parser = make_parser("pythonic", frozenset({"get_time"}))
    assert parser.feed("see [get") == [TextPiece("see ")]
    assert parser.feed("ter] or [1]") == [TextPiece("[getter] or [1]")]
    assert parser.feed(" [get_time(") == [TextPiece(" ")]
    assert parser.feed(")] then more") == []  # held to the end once a call begins
    events = parser.finish()
    assert closed(events) == [("get_time", {})]
    assert events[-1] == TextPiece(" then more")


def test_functionary_holds_only_what_may_become_a_call() -> None:
    parser = make_parser("functionary", frozenset({"f"}))
    assert parser.feed("a <func") == [TextPiece("a ")]
    assert parser.feed("tion=g>{}") == [TextPiece("<function=g>{}")]  # not an offered tool
    assert parser.feed(" <function=f>") == [TextPiece(" ")]
    assert parser.feed('{"x": "}"}</function>') == []
    assert closed(parser.finish()) == [("f", {"x": "}"})]


def test_mistral_opens_the_call_at_its_name() -> None:
    parser = make_parser("mistral", frozenset({"f"}))
    assert parser.feed("[TOOL_CALLS]f[ARGS]") == [CallOpened(0, "f")]
    assert parser.feed('{"a": "x') == [CallArguments(0, '{"a": "x')]
    assert parser.feed('"}') == [CallArguments(0, '"}'), CallClosed(0, "f", '{"a": "x"}')]


def test_llama3_opens_the_call_at_its_name() -> None:
    parser = make_parser("llama3_json", frozenset({"f"}))
    assert parser.feed('{"name": "f", "parameters": ') == []
    assert parser.feed('{"a"') == [CallOpened(0, "f"), CallArguments(0, '{"a"')]
    assert parser.feed(": 1}}") == [CallArguments(0, ": 1}"), CallClosed(0, "f", '{"a": 1}')]


def test_hermes_keeps_the_models_argument_text() -> None:
    output = '<tool_call>{"name": "f", "arguments": {"a":1,  "b": [2]}}</tool_call>'
    events = feed("hermes", [output])
    assert [e for e in events if isinstance(e, CallClosed)] == [
        CallClosed(0, "f", '{"a":1,  "b": [2]}')
    ]


def test_a_dropped_call_keeps_its_index_and_the_next_call_takes_the_next() -> None:
    output = (
        '<tool_call>{"name": "f", "arguments": {"a": oops}}</tool_call>'
        '<tool_call>{"name": "g", "arguments": {}}</tool_call>'
    )
    events = feed("hermes", [output[:40], output[40:]])
    assert CallDropped(0) in events
    assert [e for e in events if isinstance(e, CallClosed)] == [CallClosed(1, "g", "{}")]
