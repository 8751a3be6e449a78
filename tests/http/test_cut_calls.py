"""A tool call cut by the output budget (`max_output_tokens`, `max_tokens`) over real HTTP:
the response is `incomplete` with reason `max_output_tokens` (Chat: `finish_reason:
"length"`), the half-written call is never presented as a complete call, and its
`<tool_call>` markup never reaches the reply's text, stored, returned or streamed.

The fake engine answers `echo: TEXT` one word per token, so a budget of N tokens cuts the
scripted call after its N-th word: 1 cuts it before its tool's name is whole, 4 after its
head, 7 inside the input."""

from __future__ import annotations

import json
from typing import Any

import pytest

from support import FakeServer, an_ordinary_request_completes, in_thread

PATCH = "*** Begin Patch\n*** Add File: a.txt\n+hi there\n*** End Patch"
APPLY_PATCH: dict[str, Any] = {
    "type": "custom",
    "name": "apply_patch",
    "description": "Edit files with a patch.",
    "format": {"type": "grammar", "syntax": "regex", "definition": "(?s:.*)"},
}
WEATHER: dict[str, Any] = {
    "type": "function",
    "name": "get_weather",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
}
CUSTOM_CALL = json.dumps({"name": "apply_patch", "arguments": {"input": PATCH}})
FUNCTION_CALL = json.dumps({"name": "get_weather", "arguments": {"city": "New York City"}})
FORCED: list[dict[str, Any]] = [
    {  # a forced custom tool
        "tools": [WEATHER, APPLY_PATCH],
        "tool_choice": {"type": "custom", "name": "apply_patch"},
        "input": f"echo: <tool_call>{CUSTOM_CALL}</tool_call>",
    },
    {  # a function tool the model may call
        "tools": [WEATHER],
        "tool_choice": "auto",
        "input": f"echo: Checking. <tool_call>{FUNCTION_CALL}</tool_call>",
    },
]
BUDGETS = [1, 4, 7]
MARKUP = ("<tool_call", "</tool_call", '"name"', '"arguments"')


def no_markup(text: str) -> bool:
    return not any(mark in text for mark in MARKUP)


def texts(output: list[Any]) -> str:
    """All message text of a response's output items."""
    return "".join(
        part.text
        for item in output
        if item.type == "message"
        for part in item.content
        if part.type == "output_text"
    )


@pytest.mark.parametrize("case", FORCED)
@pytest.mark.parametrize("budget", BUDGETS)
async def test_a_cut_call_is_incomplete_and_no_markup_is_returned_or_stored(
    fake_server: FakeServer, case: dict[str, Any], budget: int
) -> None:
    client = fake_server.client()
    resp = await in_thread(
        client.responses.create, model="fake-model", max_output_tokens=budget, **case
    )
    assert resp.status == "incomplete"
    assert resp.incomplete_details is not None
    assert resp.incomplete_details.reason == "max_output_tokens"
    assert no_markup(texts(resp.output)), resp.output
    assert texts(resp.output).strip() == ("Checking." if "Checking" in case["input"] else "")
    for item in resp.output:  # a half-written call is never a complete one
        assert item.type not in ("custom_tool_call", "function_call") or item.status != "completed"
    stored = await in_thread(client.responses.retrieve, resp.id)
    assert stored.status == "incomplete"
    assert no_markup(texts(stored.output)), stored.output
    await an_ordinary_request_completes(fake_server)


@pytest.mark.parametrize("case", FORCED)
@pytest.mark.parametrize("budget", BUDGETS)
async def test_a_cut_call_streams_no_markup(
    fake_server: FakeServer, case: dict[str, Any], budget: int
) -> None:
    client = fake_server.client()

    def stream() -> list[Any]:
        with client.responses.stream(
            model="fake-model", max_output_tokens=budget, **case
        ) as events:
            return list(events)

    events = await in_thread(stream)
    deltas = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    done = "".join(e.text for e in events if e.type == "response.output_text.done")
    assert no_markup(deltas + done), (deltas, done)
    for event in events:
        if event.type == "response.output_item.done" and event.item.type != "message":
            assert event.item.status == "incomplete"  # the cut call is not a complete one
    final = events[-1]
    assert final.type == "response.incomplete"
    assert final.response.incomplete_details.reason == "max_output_tokens"
    assert no_markup(texts(final.response.output))
    await an_ordinary_request_completes(fake_server)


@pytest.mark.parametrize("budget", BUDGETS)
async def test_a_cut_chat_call_ends_by_length_without_markup(
    fake_server: FakeServer, budget: int
) -> None:
    client = fake_server.client()
    text = f"echo: Checking. <tool_call>{FUNCTION_CALL}</tool_call>"
    messages: Any = [{"role": "user", "content": text}]
    tools: Any = [
        {"type": "function", "function": {k: v for k, v in WEATHER.items() if k != "type"}}
    ]
    reply = await in_thread(
        client.chat.completions.create,
        model="fake-model",
        messages=messages,
        tools=tools,
        max_tokens=budget,
    )
    (choice,) = reply.choices
    assert choice.finish_reason == "length"
    assert no_markup(choice.message.content or ""), choice.message.content
    assert not choice.message.tool_calls  # a half-written call is not offered as a call

    def stream() -> list[Any]:
        chunks = client.chat.completions.create(
            model="fake-model", messages=messages, tools=tools, max_tokens=budget, stream=True
        )
        return list(chunks)

    chunks = await in_thread(stream)
    content = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert no_markup(content), content
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "length"
    await an_ordinary_request_completes(fake_server)
