"""The Hermes/Qwen tool-call parser, fed token by token with the real tokenizer."""

from __future__ import annotations

import json
from typing import Any

import pytest

from mlxcel.respond.tool_parsers import (
    CallArguments,
    CallClosed,
    CallDropped,
    CallOpened,
    HermesToolParser,
    ParseEvent,
    Qwen3CoderToolParser,
    TextPiece,
    fallback_call,
)

from support import pieces

NAMES = frozenset({"get_weather", "get_time"})


def run(chunks: list[str]) -> list[ParseEvent]:
    parser = HermesToolParser(NAMES)
    events: list[ParseEvent] = []
    for chunk in chunks:
        events += parser.feed(chunk)
    return events + parser.finish()


def summary(events: list[ParseEvent]) -> tuple[str, list[tuple[str, str]], dict[int, str]]:
    text = "".join(e.text for e in events if isinstance(e, TextPiece))
    calls = [(e.name, e.arguments) for e in events if isinstance(e, CallClosed)]
    streamed: dict[int, str] = {}
    for e in events:
        if isinstance(e, CallArguments):
            streamed[e.index] = streamed.get(e.index, "") + e.delta
    return text, calls, streamed


def test_one_call_streams_its_arguments(tokenizer: Any) -> None:
    out = 'Let me check.<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
    events = run(pieces(tokenizer, out))
    text, calls, streamed = summary(events)
    assert text == "Let me check."
    assert calls == [("get_weather", '{"city": "Paris"}')]
    assert streamed[0] == '{"city": "Paris"}'
    assert isinstance(events[1], CallOpened) or any(isinstance(e, CallOpened) for e in events)
    assert len([e for e in events if isinstance(e, CallArguments)]) > 1  # in pieces


@pytest.mark.parametrize("split", range(1, 40))
def test_calls_split_at_any_boundary(split: int) -> None:
    out = '<tool_call>{"name": "get_time", "arguments": {"tz": "UTC", "n": [1, {"a": "}"}]}}</tool_call>'
    events = run([out[:split], out[split:]])
    text, calls, streamed = summary(events)
    assert text == ""
    assert calls == [("get_time", '{"tz": "UTC", "n": [1, {"a": "}"}]}')]
    assert calls[0][1].startswith(streamed.get(0, ""))


def test_several_calls_in_one_reply(tokenizer: Any) -> None:
    out = (
        '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo"}}\n</tool_call>\n'
        '<tool_call>\n{"name": "get_time", "arguments": {}}\n</tool_call>'
    )
    text, calls, _ = summary(run(pieces(tokenizer, out)))
    assert text.strip() == ""
    assert calls == [("get_weather", '{"city": "Oslo"}'), ("get_time", "{}")]


def test_malformed_call_ends_up_as_text(tokenizer: Any) -> None:
    out = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Par\n</tool_call> ok'
    events = run(pieces(tokenizer, out))
    text, calls, _ = summary(events)
    assert calls == []
    assert "get_weather" in text
    assert text.endswith(" ok")
    assert any(isinstance(e, CallDropped) for e in events)


def test_unknown_tool_is_text() -> None:
    out = '<tool_call>{"name": "rm_rf", "arguments": {}}</tool_call>'
    text, calls, _ = summary(run([out]))
    assert calls == []
    assert "rm_rf" in text


def test_plain_text_passes_through_even_with_angle_brackets(tokenizer: Any) -> None:
    out = "a < b and <tool is not a call; x <tool_ca"
    text, calls, _ = summary(run(pieces(tokenizer, out)))
    assert (text, calls) == (out, [])


@pytest.mark.parametrize(
    "reply",
    [
        '{"name": "get_weather", "arguments": {"city": "Paris"}}',
        '```json\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n```',
        '  {"name": "get_weather", "parameters": {"city": "Paris"}}  ',
        '{"name": "get_weather", "arguments": "{\\"city\\": \\"Paris\\"}"}',
    ],
)
def test_bare_or_fenced_json_fallback(reply: str) -> None:
    name, arguments = fallback_call(reply, NAMES) or ("", "")
    assert name == "get_weather"
    assert json.loads(arguments) == {"city": "Paris"}


@pytest.mark.parametrize(
    "reply", ['{"name": "other", "arguments": {}}', "The weather is fine.", "{not json"]
)
def test_fallback_ignores_everything_else(reply: str) -> None:
    assert fallback_call(reply, NAMES) is None


@pytest.mark.parametrize("parser", [HermesToolParser, Qwen3CoderToolParser])
@pytest.mark.parametrize(
    "cut",
    [
        "<tool_call>",
        '<tool_call>\n{"name": "get_wea',
        '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Par',
        "<tool_call>\n<function=get_weather>\n<parameter=city>\nPar",
    ],
)
def test_a_call_cut_by_the_token_budget_is_dropped_not_text(
    tokenizer: Any, parser: type[HermesToolParser], cut: str
) -> None:
    reading = parser(NAMES)
    events: list[ParseEvent] = []
    for piece in pieces(tokenizer, "Let me check. " + cut):
        events += reading.feed(piece)
    events += reading.finish(cut=True)
    text, calls, _ = summary(events)
    assert (text, calls) == ("Let me check. ", [])
    opened = [e.index for e in events if isinstance(e, CallOpened)]
    assert opened == [e.index for e in events if isinstance(e, CallDropped)]


def test_a_cut_call_that_parses_whole_is_kept_and_an_unfinished_one_at_a_stop_is_text() -> None:
    whole = '<tool_call>{"name": "get_time", "arguments": {}}'
    reading = HermesToolParser(NAMES)
    events = reading.feed(whole) + reading.finish(cut=True)
    assert summary(events)[:2] == ("", [("get_time", "{}")])
    reading = HermesToolParser(NAMES)  # the model itself ended there: what it wrote stays
    events = reading.feed(whole[:-3]) + reading.finish()
    assert summary(events)[:2] == (whole[:-3], [])
