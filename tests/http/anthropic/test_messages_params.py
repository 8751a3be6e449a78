"""A Messages API body as the `ResponseParams` preparation reads: each block and setting
mapped, the billing line stripped, newer fields ignored, bad values refused."""

from __future__ import annotations

import logging
from typing import Any

import pytest
from pydantic import ValidationError

from mlxcel.errors import InvalidRequest
from mlxcel.http import messages_params
from mlxcel.http.messages_params import message_params
from mlxcel.http.messages_schemas import CountTokensBody, MessagesBody
from mlxcel.items import (
    FunctionCall,
    FunctionCallOutput,
    InputImage,
    InputText,
    Message,
    OutputText,
    Reasoning,
)

BILLING = "x-anthropic-billing-header: cc_version=2.1.37.abc; cc_entrypoint=cli; cch=f00d;"


def params(**body: Any) -> Any:
    full = {"model": "m", "max_tokens": 16, "messages": [{"role": "user", "content": "hi"}]}
    return message_params(MessagesBody.model_validate(full | body))


def test_settings_map_onto_the_responses_parameters() -> None:
    got = params(
        temperature=0.5,
        top_p=0.9,
        top_k=40,
        stop_sequences=["END"],
        metadata={"user_id": "session-1"},
        thinking={"type": "adaptive"},
    )
    assert (got.max_output_tokens, got.temperature, got.top_p, got.top_k) == (16, 0.5, 0.9, 40)
    assert got.stop == ("END",)
    assert got.user == "session-1"
    assert got.chat_template_kwargs == {"enable_thinking": True}
    assert got.store is False
    assert params().chat_template_kwargs == {"enable_thinking": False}  # off unless asked
    assert params(thinking={"type": "disabled"}).chat_template_kwargs == {"enable_thinking": False}


def test_the_billing_line_is_stripped_and_logged_once(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(messages_params, "_billing_logged", False)
    with caplog.at_level(logging.INFO, logger="mlxcel.http.messages_params"):
        as_blocks = params(
            system=[{"type": "text", "text": BILLING}, {"type": "text", "text": "You are terse."}]
        )
        as_line = params(system=f"{BILLING}\nYou are terse.")
    assert as_blocks.instructions == as_line.instructions == "You are terse."
    assert len([r for r in caplog.records if "billing" in r.getMessage()]) == 1
    kept = params(system=f"You are terse.\n{BILLING}")  # only a leading line is Claude Code's
    assert kept.instructions == f"You are terse.\n{BILLING}"
    assert (
        params(system=[{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]).instructions
        == "a\n\nb"
    )


def test_conversation_blocks_become_items_in_order() -> None:
    got = params(
        messages=[
            {"role": "user", "content": [{"type": "text", "text": "look", "cache_control": {}}]},
            {
                "role": "assistant",
                "content": [
                    {"type": "thinking", "thinking": "hmm", "signature": "sig-1"},
                    {"type": "redacted_thinking", "data": "opaque"},
                    {"type": "text", "text": "Checking."},
                    {"type": "tool_use", "id": "t1", "name": "f", "input": {"a": 1}},
                ],
            },
            {"role": "system", "content": "Mid-conversation rule."},
            {
                "role": "user",
                "content": [
                    {"type": "tool_result", "tool_use_id": "t1", "content": "ok"},
                    {
                        "type": "tool_result",
                        "tool_use_id": "t1",
                        "is_error": True,
                        "content": [{"type": "text", "text": "boom"}],
                    },
                    {"type": "text", "text": "and?"},
                ],
            },
        ]
    )
    kinds = [type(i).__name__ for i in got.input]
    assert kinds == [
        "Message",
        "Reasoning",
        "Message",
        "FunctionCall",
        "Message",
        "FunctionCallOutput",
        "FunctionCallOutput",
        "Message",
    ]
    _, trace, said, call, system, ok, failed, last = got.input
    assert got.signed == ((1, "sig-1"),)  # the trace's place, and its signature
    assert trace == Reasoning("hmm", id=trace.id)
    assert said == Message("assistant", (OutputText("Checking."),), id=said.id)
    assert call == FunctionCall("t1", "f", '{"a": 1}', call.id)
    assert system == Message("developer", (InputText("Mid-conversation rule."),), id=system.id)
    assert ok == FunctionCallOutput("t1", "ok", ok.id)
    assert failed == FunctionCallOutput(
        "t1", "Error: boom", failed.id, parts=(InputText("Error: "), InputText("boom"))
    )
    assert last == Message("user", (InputText("and?"),), id=last.id)


def test_images_by_data_url_url_or_file() -> None:
    source = {"type": "base64", "media_type": "image/png", "data": "AAAA"}
    got = params(
        messages=[
            {
                "role": "user",
                "content": [
                    {"type": "image", "source": source},
                    {"type": "image", "source": {"type": "url", "url": "https://x/y.png"}},
                    {"type": "image", "source": {"type": "file", "file_id": "file_1"}},
                    {"type": "document", "source": {"type": "text", "data": "notes"}, "title": "T"},
                ],
            }
        ]
    )
    [message] = got.input
    assert message.content == (
        InputImage("data:image/png;base64,AAAA"),
        InputImage("https://x/y.png"),
        InputImage(file_id="file_1"),
        InputText("T\n\nnotes"),
    )
    pdf = {"type": "document", "source": {"type": "url", "url": "https://x/a.pdf"}}
    with pytest.raises(InvalidRequest, match="plain-text documents"):
        params(messages=[{"role": "user", "content": [pdf]}])


def test_tools_and_tool_choice() -> None:
    tools = [
        {"name": "f", "description": "F.", "input_schema": {"type": "object"}, "cache_control": {}},
        {"type": "custom", "name": "g", "input_schema": {"type": "object"}},
        {"type": "web_search_20250305", "name": "web_search", "max_uses": 3},
    ]
    got = params(tools=tools, tool_choice={"type": "any", "disable_parallel_tool_use": True})
    assert got.tools == (
        {"type": "function", "name": "f", "description": "F.", "parameters": {"type": "object"}},
        {"type": "function", "name": "g", "parameters": {"type": "object"}},
        {"type": "web_search_20250305", "name": "web_search"},  # a hosted tool: --hosted-tools
    )
    assert (got.tool_choice, got.parallel_tool_calls) == ("required", False)
    assert params(tool_choice={"type": "tool", "name": "f"}).tool_choice == {
        "type": "function",
        "name": "f",
    }
    assert params(tool_choice={"type": "none"}).tool_choice == "none"
    assert (params(tool_choice={"type": "auto"}).parallel_tool_calls) is None


def test_fields_of_newer_clients_are_ignored() -> None:
    got = params(
        context_management={"edits": []},
        output_config={"effort": "high"},
        service_tier="auto",
        container="c",
        mcp_servers=[{"url": "x"}],
        some_field_from_2030=True,
        thinking={"type": "some_new_kind", "display": "summarized"},
    )
    assert got.chat_template_kwargs == {"enable_thinking": True}


@pytest.mark.parametrize(
    "body",
    [
        {"max_tokens": 0},
        {"max_tokens": "16"},
        {"temperature": 1.5},
        {"top_k": -1},
        {"messages": []},
        {"messages": [{"role": "tool", "content": "x"}]},
        {"messages": [{"role": "user", "content": [{"type": "video", "url": "x"}]}]},
        {
            "messages": [
                {"role": "assistant", "content": [{"type": "tool_result", "tool_use_id": "t"}]}
            ]
        },
        {"stop_sequences": ["x"] * 65},
        {"tool_choice": {"type": "tool"}},
    ],
)
def test_bad_values_are_refused(body: dict[str, Any]) -> None:
    with pytest.raises(ValidationError):
        params(**body)


def test_a_count_body_needs_no_max_tokens() -> None:
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
    got = message_params(CountTokensBody.model_validate(body))
    assert got.max_output_tokens is None
    with pytest.raises(ValidationError):
        MessagesBody.model_validate(body)
