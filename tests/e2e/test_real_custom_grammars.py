"""End to end on the real model: `custom` tools' lark and regex grammars enforced while the
model writes the call, at temperature 1 over several runs. Whether an input satisfies a
Lark grammar is read by llguidance from the tool's own grammar over the raw input; a
regex by Python's `re`."""

from __future__ import annotations

import re
import time
from typing import Any

import httpx
import llguidance
import llguidance.hf
import openai
import pytest
from openai.types.responses import ResponseCustomToolCall
from patch_grammar import PATCH_GRAMMAR

from server_process import RealServer

pytestmark = pytest.mark.e2e

APPLY_PATCH = {
    "type": "custom",
    "name": "apply_patch",
    "description": "Edit files. The input is a patch.",
    "format": {"type": "grammar", "syntax": "lark", "definition": PATCH_GRAMMAR},
}
TAG = r"[A-Z]{2,8}(?: [A-Z]{2,8}){0,3}"
LABEL = {
    "type": "custom",
    "name": "label",
    "description": "Label the text with up to four upper-case words.",
    "format": {"type": "grammar", "syntax": "regex", "definition": TAG},
}
RUNS = 4


@pytest.fixture(scope="module")
def patch_matcher() -> Any:
    from transformers import AutoTokenizer

    from mlxcel.model.provision.fetch import default_model_dir

    hf = AutoTokenizer.from_pretrained(str(default_model_dir()))
    tokenizer = llguidance.hf.from_tokenizer(hf)
    grammar = llguidance.LLMatcher.grammar_from_lark(PATCH_GRAMMAR)

    def verdict(text: str, *, whole: bool) -> bool:
        matcher = llguidance.LLMatcher(tokenizer, grammar)
        ok = all(matcher.consume_token(t) for t in hf.encode(text, add_special_tokens=False))
        return ok and (matcher.is_accepting() or not whole)

    return verdict


def _calls(output: list[Any]) -> list[ResponseCustomToolCall]:
    return [item for item in output if isinstance(item, ResponseCustomToolCall)]


def test_a_forced_patch_always_follows_the_lark_grammar(
    real_server: RealServer, patch_matcher: Any
) -> None:
    client = real_server.client()
    completed = 0
    for run in range(RUNS):
        response = client.responses.create(
            model=real_server.alias,
            input="Create the file hello.txt containing the line Hello, world.",
            tools=[APPLY_PATCH],  # type: ignore[list-item]
            tool_choice={"type": "custom", "name": "apply_patch"},
            temperature=1.0,
            max_output_tokens=400,
        )
        calls = _calls(response.output)
        if response.status == "completed":
            completed += 1
            assert len(calls) == 1, response.output
            assert patch_matcher(calls[0].input, whole=True), (run, calls[0].input)
        for call in calls:  # cut at the token budget: still on the grammar's path
            assert patch_matcher(call.input, whole=False), (run, call.input)
    assert completed >= RUNS // 2


def test_a_regex_tool_input_always_matches_in_auto_and_forced_modes(
    real_server: RealServer,
) -> None:
    client = real_server.client()
    inputs = []
    for run in range(RUNS):
        for choice in ("auto", {"type": "custom", "name": "label"}):
            response = client.responses.create(
                model=real_server.alias,
                input="Label this text with the label tool: the stock market fell sharply.",
                tools=[LABEL],  # type: ignore[list-item]
                tool_choice=choice,  # type: ignore[arg-type]
                temperature=1.0,
                max_output_tokens=64,
            )
            for call in _calls(response.output):
                inputs.append(call.input)
                assert re.fullmatch(TAG, call.input), (run, choice, call.input)
    assert len(inputs) >= RUNS  # every forced request made its call


DEEP_LARK = "start: r0\n" + "\n".join(f'r{i}: r{i + 1} r{i + 1} | "x"' for i in range(500))
DEEP_LARK += '\nr500: "y"'


@pytest.mark.parametrize(
    ("syntax", "definition", "refused"),
    [
        ("regex", "((a{100}){100}){100}", True),  # a million forced characters
        ("regex", "(a|aa)*(a|aa)*b{1000}", False),
        ("lark", DEEP_LARK, True),  # ambiguity beyond the parser's per-step limits
        ("lark", "start: /[\\s\\S]{1000}x/", False),
    ],
)
def test_a_pathological_grammar_is_answered_in_bounded_time(
    real_server: RealServer, syntax: str, definition: str, refused: bool
) -> None:
    """Answered in bounded time, or refused with a 400 naming the definition when its
    parse outgrows llguidance's per-step limits as the input begins (rather than a call
    left free)."""
    client = real_server.client()
    tool = {
        "type": "custom",
        "name": "t",
        "format": {"type": "grammar", "syntax": syntax, "definition": definition},
    }
    ask: dict[str, Any] = {
        "model": real_server.alias,
        "input": "Call the tool.",
        "tools": [tool],
        "tool_choice": {"type": "custom", "name": "t"},
        "max_output_tokens": 16,
    }
    started = time.monotonic()
    if refused:
        with pytest.raises(openai.BadRequestError) as caught:
            client.responses.create(**ask)
        assert caught.value.body["param"] == "tools[0].format.definition"  # type: ignore[index]
    else:
        response = client.responses.create(**ask)
        assert response.status in ("completed", "incomplete")
    assert time.monotonic() - started < 120
    ordinary = client.responses.create(
        model=real_server.alias, input="Say hi.", max_output_tokens=4, temperature=0
    )
    assert ordinary.status in ("completed", "incomplete")


def test_an_invalid_grammar_is_a_400_naming_the_tool(real_server: RealServer) -> None:
    tool = {**APPLY_PATCH, "format": {**APPLY_PATCH["format"], "definition": "start: nowhere"}}
    with pytest.raises(openai.BadRequestError) as caught:
        real_server.client().responses.create(
            model=real_server.alias,
            input="Patch.",
            tools=[tool],  # type: ignore[list-item]
            max_output_tokens=8,
        )
    assert caught.value.body["param"] == "tools[0].format.definition"  # type: ignore[index]
    assert "apply_patch" in caught.value.message


@pytest.mark.parametrize(
    ("syntax", "definition"),
    [("regex", "[0-9a-f]{4000}"), ("lark", "start: /[0-9a-f]{4000}/")],
)
@pytest.mark.parametrize("choice", ["auto", {"type": "custom", "name": "digest"}])
def test_a_repetition_above_the_limit_is_a_400_naming_the_definition(
    real_server: RealServer, syntax: str, definition: str, choice: Any
) -> None:
    tool = {
        "type": "custom",
        "name": "digest",
        "format": {"type": "grammar", "syntax": syntax, "definition": definition},
    }
    client = real_server.client()
    with pytest.raises(openai.BadRequestError) as caught:
        client.responses.create(
            model=real_server.alias,
            input="Write a digest.",
            tools=[tool],  # type: ignore[list-item]
            tool_choice=choice,
            max_output_tokens=8,
        )
    assert caught.value.body["param"] == "tools[0].format.definition"  # type: ignore[index]
    assert caught.value.body["code"] == "invalid_grammar"  # type: ignore[index]
    assert "digest" in caught.value.message
    assert "repetitions above 1000" in caught.value.message
    assert httpx.get(f"{real_server.url}/health", timeout=10).status_code == 200
    ordinary = client.responses.create(
        model=real_server.alias, input="Say hi.", max_output_tokens=4, temperature=0
    )
    assert ordinary.status in ("completed", "incomplete")


def test_function_parameters_no_grammar_holds_beside_a_custom_tool_are_a_400(
    real_server: RealServer,
) -> None:
    """A forced call's grammar holds the other tools' calls to their parameters too."""
    lookahead = {"type": "object", "properties": {"a": {"type": "string", "pattern": "(?=x)a"}}}
    with pytest.raises(openai.BadRequestError) as caught:
        real_server.client().responses.create(
            model=real_server.alias,
            input="Call a tool.",
            tools=[{"type": "function", "name": "f", "parameters": lookahead}, LABEL],  # type: ignore[list-item]
            tool_choice="required",
            max_output_tokens=8,
        )
    assert caught.value.body["param"] == "tools"  # type: ignore[index]
    assert caught.value.body["code"] == "invalid_tool_parameters"  # type: ignore[index]
