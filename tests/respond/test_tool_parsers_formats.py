"""Every tool-call format, fed one real token at a time and split at every character.

Each case is a scripted model reply with the text and calls it must come to. Whatever
the pieces, the events must be well formed (calls opened before they stream, indices
0, 1, 2…, streamed deltas adding up to the final arguments) and come to the same result.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
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

from support import pieces

NAMES = frozenset({"get_weather", "get_time"})
SCHEMAS: dict[str, dict[str, Any]] = {
    "get_weather": {
        "type": "object",
        "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
    },
    "get_time": {"type": "object", "properties": {"tz": {"type": "string"}}},
}
STREAMING = ("hermes", "mistral", "llama3_json", "qwen3_coder")

PARIS = [("get_weather", {"city": "Paris"})]
TWO = [("get_weather", {"city": "Oslo"}), ("get_time", {"tz": "UTC"})]


@dataclass(frozen=True)
class Case:
    kind: str
    output: str
    text: str
    calls: list[tuple[str, dict[str, Any]]]
    dropped: bool = False
    """A call to an offered tool is opened while streaming, then does not parse."""


def whole(kind: str, output: str, *, dropped: bool = False) -> Case:
    """A reply that is all text: it holds no call that parses."""
    return Case(kind, output, output, [], dropped)


QWEN_PARIS = (
    "<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n"
    "<parameter=days>\n3\n</parameter>\n</function>\n</tool_call>"
)
QWEN_TIME = (
    "<tool_call>\n<function=get_time>\n<parameter=tz>\nUTC\n</parameter>\n</function>\n</tool_call>"
)
QWEN_OSLO = "<tool_call>\n<function=get_weather>\n<parameter=city>\nOslo\n</parameter>\n</function>\n</tool_call>"

CASES = {
    # Hermes / Qwen JSON
    "hermes-one": Case(
        "hermes",
        'Let me check.<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>',
        "Let me check.",
        PARIS,
    ),
    "hermes-several": Case(
        "hermes",
        '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo"}}\n</tool_call>\n'
        '<tool_call>\n{"name": "get_time", "arguments": {"tz": "UTC"}}\n</tool_call>',
        "\n",
        TWO,
    ),
    "hermes-around": Case(
        "hermes",
        'Checking.\n<tool_call>{"name": "get_time", "arguments": {"tz": "UTC"}}</tool_call>\nDone.',
        "Checking.\n\nDone.",
        [("get_time", {"tz": "UTC"})],
    ),
    "hermes-malformed": whole(
        "hermes",
        '<tool_call>{"name": "get_weather", "arguments": {"city": Paris}}</tool_call> ok',
        dropped=True,
    ),
    "hermes-unknown": whole("hermes", '<tool_call>{"name": "rm_rf", "arguments": {}}</tool_call>'),
    "hermes-cut-off": whole(
        "hermes", 'x<tool_call>{"name": "get_weather", "arguments": {"city": "Pa', dropped=True
    ),
    # Mistral
    "mistral-one": Case(
        "mistral", 'Sure.[TOOL_CALLS]get_weather[ARGS]{"city": "Paris"}', "Sure.", PARIS
    ),
    "mistral-markers": Case(
        "mistral",
        '[TOOL_CALLS]get_weather[ARGS]{"city": "Oslo"}[TOOL_CALLS]get_time[ARGS]{"tz": "UTC"}',
        "",
        TWO,
    ),
    "mistral-consecutive": Case(
        "mistral",
        '[TOOL_CALLS]get_weather[ARGS]{"city": "Oslo"} get_time[ARGS]{"tz": "UTC"}\n',
        "",
        TWO,
    ),
    "mistral-call-id": Case(
        "mistral",
        '[TOOL_CALLS]get_weather[CALL_ID]a1B2c3D4e[ARGS]{"city": "Paris"}',
        "",
        PARIS,
    ),
    "mistral-list": Case(
        "mistral",
        '[TOOL_CALLS] [{"name": "get_weather", "arguments": {"city": "Oslo"}}, '
        '{"name": "get_time", "arguments": {"tz": "UTC"}}]',
        "",
        TWO,
    ),
    "mistral-around": Case(
        "mistral",
        'On it. [TOOL_CALLS]get_time[ARGS]{"tz": "UTC"}\nDone.',
        "On it. \nDone.",
        [("get_time", {"tz": "UTC"})],
    ),
    "mistral-malformed": whole(
        "mistral", '[TOOL_CALLS]get_weather[ARGS]{"city": Paris} later', dropped=True
    ),
    "mistral-malformed-list": whole(
        "mistral",
        '[TOOL_CALLS][{"name": "get_weather", "arguments": {"city": Paris}}]',
        dropped=True,
    ),
    "mistral-unknown": whole("mistral", '[TOOL_CALLS]rm_rf[ARGS]{"path": "/"}'),
    "mistral-unknown-in-list": Case(
        "mistral",
        '[TOOL_CALLS][{"name": "get_time", "arguments": {"tz": "UTC"}}, '
        '{"name": "rm_rf", "arguments": {}}]',
        ', {"name": "rm_rf", "arguments": {}}]',
        [("get_time", {"tz": "UTC"})],
    ),
    "mistral-no-call": whole("mistral", "[TOOL_CALLS] sorry, no tool fits"),
    # Llama 3 JSON
    "llama3-one": Case(
        "llama3_json", '{"name": "get_weather", "parameters": {"city": "Paris"}}', "", PARIS
    ),
    "llama3-tag": Case(
        "llama3_json",
        '<|python_tag|>{"name": "get_weather", "parameters": {"city": "Paris"}}',
        "",
        PARIS,
    ),
    "llama3-several": Case(
        "llama3_json",
        '{"name": "get_weather", "parameters": {"city": "Oslo"}}; '
        '{"type": "function", "name": "get_time", "arguments": {"tz": "UTC"}}',
        "",
        TWO,
    ),
    "llama3-around": Case(
        "llama3_json",
        'Let me look.<|python_tag|>{"name": "get_time", "parameters": {"tz": "UTC"}}\nDone.',
        "Let me look.\nDone.",
        [("get_time", {"tz": "UTC"})],
    ),
    "llama3-prose": whole("llama3_json", 'The weather is {"fine": true} today.'),
    "llama3-json-not-call": whole("llama3_json", ' {"answer": 42} is the answer'),
    "llama3-malformed": whole(
        "llama3_json", '{"name": "get_weather", "parameters": {"city": Paris}}', dropped=True
    ),
    "llama3-unknown": whole("llama3_json", '{"name": "rm_rf", "parameters": {"path": "/"}}'),
    # Qwen3-Coder XML
    "qwen3-one": Case(
        "qwen3_coder", QWEN_PARIS, "", [("get_weather", {"city": "Paris", "days": 3})]
    ),
    "qwen3-several": Case("qwen3_coder", f"{QWEN_OSLO}\n{QWEN_TIME}", "\n", TWO),
    "qwen3-around": Case(
        "qwen3_coder",
        f"I will check.\n{QWEN_TIME}\nDone.",
        "I will check.\n\nDone.",
        [("get_time", {"tz": "UTC"})],
    ),
    "qwen3-json-body": Case(
        "qwen3_coder",
        '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>',
        "",
        PARIS,
    ),
    "qwen3-malformed": whole(
        "qwen3_coder",
        "<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n"
        "oops\n</function>\n</tool_call> ok",
        dropped=True,
    ),
    "qwen3-unknown": whole(
        "qwen3_coder",
        "<tool_call>\n<function=rm_rf>\n<parameter=path>\n/\n</parameter>\n</function>\n</tool_call>",
    ),
    "qwen3-cut-off": whole(
        "qwen3_coder",
        "<tool_call>\n<function=get_weather>\n<parameter=city>\nPar",
        dropped=True,
    ),
    # Functionary v3.1
    "functionary-one": Case(
        "functionary",
        'Let me check. <function=get_weather>{"city": "Paris"}</function>',
        "Let me check. ",
        PARIS,
    ),
    "functionary-several": Case(
        "functionary",
        '<function=get_weather>{"city": "Oslo"}</function>\n<function=get_time>{"tz": "UTC"}',
        "",
        TWO,
    ),
    "functionary-around": Case(
        "functionary",
        'Sure.\n<function=get_time>{"tz": "UTC"}</function>\nDone.',
        "Sure.\n\nDone.",
        [("get_time", {"tz": "UTC"})],
    ),
    "functionary-malformed": whole(
        "functionary", '<function=get_weather>{"city": Paris}</function>'
    ),
    "functionary-unknown": whole("functionary", '<function=rm_rf>{"path": "/"}</function>'),
    "functionary-prose": whole("functionary", "a <function is not a call, nor <function=x"),
    # Pythonic
    "pythonic-one": Case("pythonic", '[get_weather(city="Paris")]', "", PARIS),
    "pythonic-several": Case(
        "pythonic", "[get_weather(city='Oslo'), get_time(tz=\"UTC\")]\n", "", TWO
    ),
    "pythonic-around": Case(
        "pythonic",
        'Sure! [get_time(tz="UTC")] Done.',
        "Sure!  Done.",
        [("get_time", {"tz": "UTC"})],
    ),
    "pythonic-malformed": whole("pythonic", '[get_weather(city="Paris"]'),
    "pythonic-positional": whole("pythonic", '[get_weather("Paris")]'),
    "pythonic-not-literal": whole("pythonic", "[get_weather(city=input())]"),
    "pythonic-unknown": whole("pythonic", '[rm_rf(path="/")]'),
    "pythonic-prose": whole("pythonic", "See [1] and [the docs](x) or [get_time"),
}


def run(kind: str, chunks: list[str]) -> tuple[list[list[ParseEvent]], str]:
    """The events after each chunk (and after `finish`), and the parser's text."""
    parser = make_parser(kind, NAMES, SCHEMAS)
    events = [parser.feed(chunk) for chunk in chunks]
    events.append(parser.finish())
    return events, parser.text


@dataclass
class Result:
    text: str
    calls: list[tuple[int, str, str]]
    dropped: list[int]


def check(events: list[ParseEvent]) -> Result:
    """The text and calls the events come to, once they are checked to be well formed."""
    state: dict[int, str] = {}
    names: dict[int, str] = {}
    streamed: dict[int, str] = {}
    result = Result("", [], [])
    for event in events:
        match event:
            case TextPiece(text):
                assert text
                result.text += text
            case CallOpened(index, name):
                assert index not in state
                assert name in NAMES
                state[index], names[index], streamed[index] = "open", name, ""
            case CallArguments(index, delta):
                assert state.get(index) == "open"
                streamed[index] += delta
            case CallClosed(index, name, arguments):
                assert state.get(index) == "open"
                assert name == names[index]
                assert streamed[index] == arguments  # the deltas add up to the arguments
                assert isinstance(json.loads(arguments), dict)
                state[index] = "closed"
                result.calls.append((index, name, arguments))
            case CallDropped(index):
                assert state.get(index) == "open"
                state[index] = "dropped"
                result.dropped.append(index)
    assert sorted(state) == list(range(len(state)))  # indices 0, 1, 2…
    assert all(s != "open" for s in state.values())
    return result


def settle(kind: str, chunks: list[str]) -> Result:
    events, text = run(kind, chunks)
    result = check([e for step in events for e in step])
    assert text == result.text
    return result


def assert_matches(case: Case, result: Result, *, streamed: bool) -> None:
    assert result.text == case.text
    calls = [(name, json.loads(arguments)) for _, name, arguments in result.calls]
    assert calls == case.calls
    assert [index for index, _, _ in result.calls] == sorted(i for i, _, _ in result.calls)
    if case.dropped and case.kind in STREAMING and streamed:
        assert result.dropped
    if not case.dropped:
        assert result.dropped == []


@pytest.mark.parametrize("name", CASES)
def test_token_by_token(tokenizer: Any, name: str) -> None:
    case = CASES[name]
    result = settle(case.kind, pieces(tokenizer, case.output))
    assert_matches(case, result, streamed=True)
    assert result.calls == settle(case.kind, [case.output]).calls  # same arguments text


@pytest.mark.parametrize("name", CASES)
def test_split_at_every_character(name: str) -> None:
    case = CASES[name]
    whole_result = settle(case.kind, [case.output])
    assert_matches(case, whole_result, streamed=False)
    for split in range(1, len(case.output)):
        result = settle(case.kind, [case.output[:split], case.output[split:]])
        assert (result.text, result.calls) == (whole_result.text, whole_result.calls), split
    result = settle(case.kind, list(case.output))
    assert (result.text, result.calls) == (whole_result.text, whole_result.calls)


@pytest.mark.parametrize("name", [n for n, c in CASES.items() if c.kind in STREAMING and c.calls])
def test_calls_open_and_stream_before_they_end(tokenizer: Any, name: str) -> None:
    case = CASES[name]
    events, _ = run(case.kind, pieces(tokenizer, case.output))
    first_call = len(events)
    for step, batch in enumerate(events):
        if any(isinstance(e, CallClosed) for e in batch):
            first_call = min(first_call, step)
            break
    opened = [i for i, batch in enumerate(events) if any(isinstance(e, CallOpened) for e in batch)]
    streamed = [
        i for i, batch in enumerate(events) if any(isinstance(e, CallArguments) for e in batch)
    ]
    assert opened[0] < first_call
    assert streamed[0] < first_call


@pytest.mark.parametrize(
    "kind", ["hermes", "mistral", "llama3_json", "qwen3_coder", "functionary", "pythonic"]
)
def test_prose_passes_through_at_once(tokenizer: Any, kind: str) -> None:
    prose = "The weather in Paris is mild, about 18 degrees; bring a light coat."
    chunks = pieces(tokenizer, prose)
    events, _ = run(kind, chunks)
    fed = released = ""
    for chunk, batch in zip(chunks, events, strict=False):
        fed += chunk
        released += "".join(e.text for e in batch if isinstance(e, TextPiece))
        assert released == fed
