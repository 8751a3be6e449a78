"""End to end on the real model: `custom` tools' lark and regex grammars enforced while the
model writes the call, at temperature 1 over several runs. Whether an input satisfies a
Lark grammar is read by llguidance from the tool's own grammar over the raw input; a
regex by Python's `re`."""

from __future__ import annotations

import re
from typing import Any

import llguidance
import llguidance.hf
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
