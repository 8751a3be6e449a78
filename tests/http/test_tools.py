"""Function tools over real HTTP with the `openai` SDK (fake engine scripts the replies)."""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest
from openai.types.responses import ResponseFunctionToolCall

from support import FakeServer, in_thread

WEATHER = {
    "type": "function",
    "name": "get_weather",
    "description": "The weather in a city.",
    "parameters": {
        "type": "object",
        "properties": {"city": {"type": "string"}},
        "required": ["city"],
        "additionalProperties": False,
    },
    "strict": True,
}
CALL = '{"name": "get_weather", "arguments": {"city": "Paris"}}'


async def test_tagged_call_becomes_a_function_call_item(fake_server: FakeServer) -> None:
    client = fake_server.client()
    resp = await in_thread(
        client.responses.create,
        model="fake-model",
        input=f"echo: Checking. <tool_call>{CALL}</tool_call>",
        tools=[WEATHER],
    )
    assert [item.type for item in resp.output] == ["message", "function_call"]
    call = resp.output[1]
    assert isinstance(call, ResponseFunctionToolCall)
    assert call.name == "get_weather"
    assert json.loads(call.arguments) == {"city": "Paris"}
    assert call.call_id.startswith("call_")
    assert call.id is not None
    assert call.id.startswith("fc_")
    assert call.status == "completed"
    assert resp.output_text.strip() == "Checking."
    assert resp.tools[0].name == "get_weather"  # type: ignore[union-attr]


async def test_streamed_arguments_concatenate_to_the_final_ones(fake_server: FakeServer) -> None:
    client = fake_server.client()

    def stream() -> tuple[list[Any], Any]:
        with client.responses.stream(
            model="fake-model", input=f"echo: <tool_call>{CALL}</tool_call>", tools=[WEATHER]
        ) as s:
            return list(s), s.get_final_response()

    events, final = await in_thread(stream)
    types = [e.type for e in events]
    assert "response.function_call_arguments.delta" in types
    deltas = "".join(e.delta for e in events if e.type == "response.function_call_arguments.delta")
    done = next(e for e in events if e.type == "response.function_call_arguments.done")
    call = final.output[0]
    assert deltas == done.arguments == call.arguments
    added = next(e for e in events if e.type == "response.output_item.added")
    assert added.item.type == "function_call"
    assert added.item.id == call.id
    assert [e.sequence_number for e in events] == list(range(len(events)))


@pytest.mark.parametrize("reply", [CALL, f"```json {CALL} ```"])
async def test_bare_or_fenced_json_reply_is_a_call(fake_server: FakeServer, reply: str) -> None:
    client = fake_server.client()
    resp = await in_thread(
        client.responses.create, model="fake-model", input=f"echo: {reply}", tools=[WEATHER]
    )
    assert [item.type for item in resp.output] == ["function_call"]


async def test_plain_reply_and_tool_choice_none(fake_server: FakeServer) -> None:
    client = fake_server.client()
    plain = await in_thread(
        client.responses.create, model="fake-model", input="echo: Sunny.", tools=[WEATHER]
    )
    assert plain.output_text == "Sunny."
    none = await in_thread(
        client.responses.create,
        model="fake-model",
        input=f"echo: {CALL}",
        tools=[WEATHER],
        tool_choice="none",
    )
    assert [item.type for item in none.output] == ["message"]


@pytest.mark.parametrize(
    "choice",
    [
        "required",
        {"type": "function", "name": "get_weather"},
        {"type": "function", "function": {"name": "get_weather"}},
    ],
)
async def test_forced_call_forms(fake_server: FakeServer, choice: Any) -> None:
    client = fake_server.client()
    resp = await in_thread(
        client.responses.create,
        model="fake-model",
        input=f"echo: {CALL}",
        tools=[WEATHER],
        tool_choice=choice,
    )
    assert [item.type for item in resp.output] == ["function_call"]


@pytest.mark.parametrize(
    ("extra", "param"),
    [
        ({"tools": [{"type": "web_search"}]}, "tools[0].type"),
        ({"tools": [WEATHER], "tool_choice": {"type": "function", "name": "nope"}}, "tool_choice"),
        ({"tool_choice": "required"}, "tool_choice"),
        ({"tools": [WEATHER], "tool_choice": {"type": "mcp"}}, "tool_choice"),
        ({"tools": [{"type": "function"}]}, "tools[0].name"),
    ],
)
async def test_bad_tools_are_400(
    fake_server: FakeServer, extra: dict[str, Any], param: str
) -> None:
    async with httpx.AsyncClient(timeout=30) as http:
        r = await http.post(
            f"{fake_server.url}/v1/responses", json={"model": "fake-model", "input": "x", **extra}
        )
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == param


async def test_function_call_output_round_trip(fake_server: FakeServer) -> None:
    client = fake_server.client()
    first = await in_thread(
        client.responses.create, model="fake-model", input=f"echo: {CALL}", tools=[WEATHER]
    )
    call = first.output[0]
    assert isinstance(call, ResponseFunctionToolCall)
    follow = await in_thread(
        client.responses.create,
        model="fake-model",
        tools=[WEATHER],
        previous_response_id=first.id,
        input=[{"type": "function_call_output", "call_id": call.call_id, "output": "sunny"}],
    )
    assert follow.status == "completed"
