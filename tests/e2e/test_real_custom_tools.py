"""End to end on the real model: a `custom` tool (free-form input) with the `openai` SDK."""

from __future__ import annotations

from typing import Any

import httpx
import pytest
from openai.types.responses import ResponseCustomToolCall

from server_process import RealServer

pytestmark = pytest.mark.e2e

SHOUT = {
    "type": "custom",
    "name": "shout",
    "description": "Shout a short word.",
    "format": {"type": "grammar", "syntax": "regex", "definition": "[A-Z]+"},
}
INPUT = {"type": "object", "properties": {"input": {"type": "string"}}, "required": ["input"]}


def test_a_forced_custom_tool_streams_a_call_and_takes_its_output(
    real_server: RealServer,
) -> None:
    client = real_server.client()
    with client.responses.stream(
        model=real_server.alias,
        input="Shout the word hi.",
        tools=[SHOUT],  # type: ignore[list-item]
        tool_choice={"type": "custom", "name": "shout"},
        temperature=0,
        max_output_tokens=48,
    ) as stream:
        events = list(stream)
        final = stream.get_final_response()
    assert final.status == "completed"
    (call,) = final.output
    assert isinstance(call, ResponseCustomToolCall)
    assert call.name == "shout"
    assert isinstance(call.input, str)
    assert call.input.strip()
    deltas = [e.delta for e in events if e.type == "response.custom_tool_call_input.delta"]
    (done,) = [e for e in events if e.type == "response.custom_tool_call_input.done"]
    assert "".join(deltas) == done.input == call.input

    answer = client.responses.create(
        model=real_server.alias,
        previous_response_id=final.id,
        tools=[SHOUT],  # type: ignore[list-item]
        input=[{"type": "custom_tool_call_output", "call_id": call.call_id, "output": "HI!"}],
        temperature=0,
        max_output_tokens=32,
    )
    assert answer.status in ("completed", "incomplete")
    assert answer.output  # the model answered the tool's output


MARKUP = ("<tool_call", "</tool_call", '"name"', '"arguments"')


def _no_markup(text: str) -> bool:
    return not any(mark in text for mark in MARKUP)


@pytest.mark.parametrize("budget", [1, 4, 9])
def test_a_forced_call_cut_by_max_output_tokens_is_incomplete_without_markup(
    real_server: RealServer, budget: int
) -> None:
    """The forced call is `<tool_call>`, then `{"name": "shout", "arguments": {"input": "…`
    token by token: each budget cuts it, at its tag, its name or its input."""
    client = real_server.client()
    ask: dict[str, Any] = {
        "model": real_server.alias,
        "input": "Shout the word hello.",
        "tools": [SHOUT],
        "tool_choice": {"type": "custom", "name": "shout"},
        "temperature": 0,
        "max_output_tokens": budget,
    }
    response = client.responses.create(**ask)
    assert response.status == "incomplete"
    assert response.incomplete_details is not None
    assert response.incomplete_details.reason == "max_output_tokens"
    assert _no_markup(response.output_text), response.output
    assert not [i for i in response.output if isinstance(i, ResponseCustomToolCall)]
    stored = client.responses.retrieve(response.id)
    assert _no_markup(stored.output_text), stored.output
    with client.responses.stream(**ask) as stream:
        events = list(stream)
    texts = [e.delta for e in events if e.type == "response.output_text.delta"]
    assert _no_markup("".join(texts)), texts
    assert events[-1].type == "response.incomplete"
    chat = client.chat.completions.create(
        model=real_server.alias,
        messages=[{"role": "user", "content": "Shout the word hello."}],
        tools=[{"type": "function", "function": {"name": "shout", "parameters": INPUT}}],
        tool_choice={"type": "function", "function": {"name": "shout"}},
        temperature=0,
        max_tokens=budget,
    )
    assert chat.choices[0].finish_reason == "length"
    assert _no_markup(chat.choices[0].message.content or ""), chat.choices[0].message
    assert httpx.get(f"{real_server.url}/health", timeout=10).status_code == 200
    ordinary = client.responses.create(
        model=real_server.alias, input="Say hi.", max_output_tokens=4, temperature=0
    )
    assert ordinary.status in ("completed", "incomplete")
    assert ordinary.output_text
