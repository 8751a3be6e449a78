"""Conversation items to chat-template messages."""

from __future__ import annotations

from typing import Any

import pytest

from mlxcel.errors import InvalidRequest
from mlxcel.items import (
    FunctionCall,
    FunctionCallOutput,
    InputText,
    Message,
    OutputText,
    Reasoning,
    Refusal,
)
from mlxcel.model.prompt import TemplateCodec, merge_system
from mlxcel.prepare.chat_messages import to_chat


def test_instructions_developer_and_assistant_parts() -> None:
    items = [
        Message("developer", (InputText("be terse"),)),
        Message("user", (InputText("hi "), InputText("there"))),
        Message("assistant", (OutputText("hello"), Refusal(" but no"))),
        Reasoning("thinking"),
        Message("user", (InputText("again"),)),
    ]
    assert to_chat("sys", items) == [
        {"role": "system", "content": "sys"},
        {"role": "system", "content": "be terse"},
        {"role": "user", "content": "hi there"},
        {"role": "assistant", "content": "hello but no"},
        {"role": "user", "content": "again"},
    ]


def test_function_calls_join_the_assistant_turn_and_outputs_are_tool_messages() -> None:
    items = [
        Message("user", (InputText("weather?"),)),
        Message("assistant", (OutputText("checking"),)),
        FunctionCall("call_1", "get_weather", '{"city": "Paris"}'),
        FunctionCall("call_2", "get_time", "not json"),
        FunctionCallOutput("call_1", "sunny"),
    ]
    chat = to_chat(None, items)
    assert chat[1]["tool_calls"] == [
        {
            "id": "call_1",
            "type": "function",
            "function": {"name": "get_weather", "arguments": {"city": "Paris"}},
        },
        {
            "id": "call_2",
            "type": "function",
            "function": {"name": "get_time", "arguments": "not json"},
        },
    ]
    assert chat[2] == {"role": "tool", "tool_call_id": "call_1", "content": "sunny"}


def test_the_trace_before_a_call_is_the_call_turns_reasoning() -> None:
    """A turn that calls without text first keeps its trace (templates show it in tool
    loops), and a trace is read once: the next turn does not inherit it."""
    items = [
        Message("user", (InputText("weather?"),)),
        Reasoning("I should look it up"),
        FunctionCall("call_1", "get_weather", "{}"),
        FunctionCallOutput("call_1", "sunny"),
        Message("assistant", (OutputText("sunny"),)),
    ]
    chat = to_chat(None, items)
    assert chat[1]["reasoning_content"] == "I should look it up"
    assert chat[1]["tool_calls"][0]["id"] == "call_1"
    assert "reasoning_content" not in chat[3]


def test_a_namespaced_call_renders_under_its_flat_name() -> None:
    items = [
        Message("user", (InputText("who is 7?"),)),
        FunctionCall("call_1", "lookup", '{"id": "7"}', namespace="crm"),
        FunctionCall("call_2", "find", "{}", namespace="mcp__files__"),
    ]
    calls = to_chat(None, items)[1]["tool_calls"]
    assert [c["function"]["name"] for c in calls] == ["crm__lookup", "mcp__files__find"]


def test_input_without_a_user_turn_is_rejected() -> None:
    with pytest.raises(InvalidRequest):
        to_chat("sys", [Message("assistant", (OutputText("x"),))])


def test_merge_system_keeps_order() -> None:
    chat = [
        {"role": "system", "content": "a"},
        {"role": "user", "content": "u"},
        {"role": "system", "content": "b"},
    ]
    assert merge_system(chat) == [
        {"role": "system", "content": "a\n\nb"},
        {"role": "user", "content": "u"},
    ]


class OneSystemTokenizer:
    """A template that, like several real ones, accepts only a leading system message."""

    def apply_chat_template(self, conversation: Any, **kwargs: Any) -> str:
        if any(m["role"] == "system" for m in conversation[1:]):
            raise ValueError("System message must be at the beginning.")
        return "|".join(f"{m['role']}:{m['content']}" for m in conversation)

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        return [ord(c) for c in text]


def test_codec_merges_system_messages_when_the_template_insists() -> None:
    codec = TemplateCodec(OneSystemTokenizer())
    chat = [
        {"role": "system", "content": "a"},
        {"role": "user", "content": "u"},
        {"role": "system", "content": "b"},
    ]
    text = "".join(chr(t) for t in codec.render(chat, None))
    assert text == "system:a\n\nb|user:u"


def test_codec_reports_a_template_that_rejects_the_input() -> None:
    class Broken(OneSystemTokenizer):
        def apply_chat_template(self, conversation: Any, **kwargs: Any) -> str:
            raise ValueError("no")

    with pytest.raises(InvalidRequest) as info:
        TemplateCodec(Broken()).render([{"role": "user", "content": "u"}], None)
    assert info.value.code == "invalid_prompt"
