"""Model output that must not break a tool-call parser: odd names, deep nesting, values
JSON has no room for, and tool schemas that are not objects. None of it is a call."""

from __future__ import annotations

import json
from typing import Any

import pytest

from mlxcel.respond.tool_parsers import (
    PARSERS,
    CallClosed,
    CallOpened,
    ParseEvent,
    TextPiece,
    fallback_call,
    make_parser,
    parse_call,
)

NAMES = frozenset({"f"})
DEEP = "[" * 5000 + "]" * 5000


def feed(kind: str, text: str, schemas: Any = None) -> list[ParseEvent]:
    parser = make_parser(kind, NAMES, schemas)
    events = [e for c in (text[: len(text) // 2], text[len(text) // 2 :]) for e in parser.feed(c)]
    return events + parser.finish()


def calls(events: list[ParseEvent]) -> list[tuple[str, Any]]:
    return [(e.name, json.loads(e.arguments)) for e in events if isinstance(e, CallClosed)]


def text(events: list[ParseEvent]) -> str:
    return "".join(e.text for e in events if isinstance(e, TextPiece))


def call_in(kind: str, arguments: str) -> str:
    """A call to `f` with `arguments` (object text), written in the `kind` format."""
    body = f'{{"name": "f", "arguments": {arguments}}}'
    return {
        "hermes": f"<tool_call>{body}</tool_call>",
        "qwen3_coder": f"<tool_call>{body}</tool_call>",
        "mistral": f"[TOOL_CALLS]f[ARGS]{arguments}",
        "llama3_json": body,
        "functionary": f"<function=f>{arguments}</function>",
        "pythonic": f"[f(a={arguments})]",
    }[kind]


@pytest.mark.parametrize("name", ['["f"]', '{"f": 1}', "1", "null", "true"])
def test_a_name_that_is_not_a_string_is_not_a_call(name: str) -> None:
    reply = f'{{"name": {name}, "arguments": {{}}}}'
    assert parse_call(reply, NAMES) is None
    assert fallback_call(reply, NAMES) is None
    assert fallback_call(f"```json\n{reply}\n```", NAMES) is None
    for kind, markup in [
        ("hermes", f"<tool_call>{reply}</tool_call>"),
        ("qwen3_coder", f"<tool_call>{reply}</tool_call>"),
        ("llama3_json", reply),
        ("llama3_json", f"<|python_tag|>{reply}"),
        ("mistral", f"[TOOL_CALLS][{reply}]"),
    ]:
        events = feed(kind, markup)
        assert calls(events) == []
        assert text(events) == markup


@pytest.mark.parametrize("kind", PARSERS)
def test_deep_nesting_in_a_call_is_text(kind: str) -> None:
    deep = "[" * 150 + "]" * 150 if kind == "pythonic" else DEEP  # Python stops at 200
    markup = call_in(kind, f'{{"a": {deep}}}')
    events = feed(kind, markup)
    assert calls(events) == []
    assert text(events) == markup


@pytest.mark.parametrize("reply", [DEEP, "{" * 5000, f'{{"name": "f", "arguments": {DEEP}}}'])
def test_deep_nesting_is_not_a_bare_call(reply: str) -> None:
    assert fallback_call(reply, NAMES) is None
    assert fallback_call(f"```{reply}```", NAMES) is None


@pytest.mark.parametrize("kind", [k for k in PARSERS if k != "pythonic"])
@pytest.mark.parametrize("value", ["NaN", "-Infinity", "1e400"])
def test_numbers_json_cannot_hold_are_not_arguments(kind: str, value: str) -> None:
    events = feed(kind, call_in(kind, f'{{"a": {value}}}'))
    assert calls(events) == []  # a call's arguments are always strict JSON
    assert parse_call(f'{{"name": "f", "arguments": {{"a": {value}}}}}', NAMES) is None


@pytest.mark.parametrize("kind", [*PARSERS, "fallback"])
def test_escaped_lone_surrogates_stay_escaped_in_arguments(kind: str) -> None:
    arguments = '{"a": "\\ud800", "b": ["\\udfff x"]}'
    if kind == "fallback":
        found = fallback_call(f'{{"name": "f", "arguments": {arguments}}}', NAMES)
        assert found is not None
        result = [(found[0], found[1])]
    else:
        result = [
            (e.name, e.arguments)
            for e in feed(kind, call_in(kind, arguments))
            if isinstance(e, CallClosed)
        ]
    assert [name for name, _ in result] == ["f"]
    result[0][1].encode()  # a response must encode to UTF-8
    assert "\\ud800" in result[0][1]


@pytest.mark.parametrize(
    "schemas",
    [
        {"f": "x"},
        {"f": ["a"]},
        {"f": 5},
        {"f": None},
        {"f": {"properties": "x"}},
        {"f": {"properties": ["a"]}},
        {"f": {"properties": {"a": "x"}}},
        {"f": {"properties": {"a": ["integer"]}}},
        {"f": {"properties": {"a": {"type": 3, "anyOf": "x", "oneOf": [1, "y", None]}}}},
        "x",
        ["f"],
    ],
)
def test_qwen3_coder_takes_any_parameter_schema(schemas: Any) -> None:
    markup = "<tool_call>\n<function=f>\n<parameter=a>\n12\n</parameter>\n</function>\n</tool_call>"
    events = feed("qwen3_coder", markup, schemas)
    assert calls(events) == [("f", {"a": "12"})]  # without a usable type, a value is text
    assert [e for e in events if isinstance(e, CallOpened)] == [CallOpened(0, "f")]


def test_qwen3_coder_reads_deeply_nested_schema_options() -> None:
    schema: dict[str, Any] = {"type": "integer"}
    for _ in range(5000):
        schema = {"anyOf": [schema]}
    events = feed(
        "qwen3_coder",
        "<tool_call><function=f><parameter=a>12</parameter></function></tool_call>",
        {"f": {"properties": {"a": schema}}},
    )
    assert calls(events) == [("f", {"a": "12"})]  # too deep to read its type: text
