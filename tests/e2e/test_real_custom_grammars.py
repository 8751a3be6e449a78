"""End to end on the real model: `custom` tools' lark and regex grammars enforced while the
model writes the call, at temperature 1 over several runs. Whether an input satisfies a
Lark grammar is read by llguidance from the tool's own grammar over the raw input; a
regex by Python's `re`."""

from __future__ import annotations

import re
import time
from typing import Any

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
    ("syntax", "definition"),
    [
        ("regex", "((a{100}){100}){100}"),
        ("regex", "(a|aa)*(a|aa)*b{1000}"),
        ("lark", DEEP_LARK),
        ("lark", "start: /[\\s\\S]{1000}x/"),
    ],
)
def test_a_pathological_grammar_is_answered_in_bounded_time(
    real_server: RealServer, syntax: str, definition: str
) -> None:
    client = real_server.client()
    tool = {
        "type": "custom",
        "name": "t",
        "format": {"type": "grammar", "syntax": syntax, "definition": definition},
    }
    started = time.monotonic()
    response = client.responses.create(
        model=real_server.alias,
        input="Call the tool.",
        tools=[tool],  # type: ignore[list-item]
        tool_choice={"type": "custom", "name": "t"},
        max_output_tokens=16,
    )
    assert time.monotonic() - started < 120
    assert response.status in ("completed", "incomplete")
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
