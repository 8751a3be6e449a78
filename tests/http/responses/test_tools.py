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


CRM = {
    "type": "namespace",
    "name": "crm",
    "description": "Customer records.",
    "tools": [
        {
            "type": "function",
            "name": "lookup",
            "description": "Find a customer.",
            "parameters": {"type": "object", "properties": {"id": {"type": "string"}}},
        }
    ],
}
CRM_CALL = '{"name": "crm__lookup", "arguments": {"id": "7"}}'


async def test_namespace_tools_are_flattened_and_calls_carry_the_namespace(
    fake_server: FakeServer,
) -> None:
    client = fake_server.client()
    resp = await in_thread(
        client.responses.create,
        model="fake-model",
        input=f"echo: <tool_call>{CRM_CALL}</tool_call>",
        tools=[WEATHER, CRM],  # type: ignore[list-item]
    )
    (call,) = resp.output
    assert isinstance(call, ResponseFunctionToolCall)
    assert (call.namespace, call.name) == ("crm", "lookup")
    assert json.loads(call.arguments) == {"id": "7"}
    # The call goes back as input, namespace and all, and the turn renders.
    follow = await in_thread(
        client.responses.create,
        model="fake-model",
        tools=[WEATHER, CRM],  # type: ignore[list-item]
        input=[
            {"role": "user", "content": "who is 7?"},
            call.model_dump(exclude_none=True),  # type: ignore[list-item]
            {"type": "function_call_output", "call_id": call.call_id, "output": "Ada"},
        ],
    )
    assert follow.status == "completed"
    items = await in_thread(client.responses.input_items.list, follow.id)
    echoed = next(i for i in items.data if i.type == "function_call")
    assert echoed.namespace == "crm"  # type: ignore[union-attr]


async def test_a_namespaced_function_can_be_forced_by_its_own_name(
    fake_server: FakeServer,
) -> None:
    client = fake_server.client()
    resp = await in_thread(
        client.responses.create,
        model="fake-model",
        input=f"echo: {CRM_CALL}",
        tools=[WEATHER, CRM],  # type: ignore[list-item]
        tool_choice={"type": "function", "name": "lookup"},
    )
    (call,) = resp.output
    assert isinstance(call, ResponseFunctionToolCall)
    assert (call.namespace, call.name) == ("crm", "lookup")


@pytest.mark.parametrize(
    ("tool", "param"),
    [
        ({"type": "namespace", "tools": []}, "tools[0].name"),
        ({"type": "namespace", "name": "x"}, "tools[0].tools"),
        (
            {"type": "namespace", "name": "x", "tools": [{"type": "custom"}]},
            "tools[0].tools[0].name",
        ),
        (
            {"type": "namespace", "name": "x", "tools": [{"type": "function"}]},
            "tools[0].tools[0].name",
        ),
    ],
)
async def test_bad_namespace_tools_are_400(
    fake_server: FakeServer, tool: dict[str, Any], param: str
) -> None:
    async with httpx.AsyncClient(timeout=30) as http:
        r = await http.post(
            f"{fake_server.url}/v1/responses",
            json={"model": "fake-model", "input": "x", "tools": [tool]},
        )
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == param


TWO_CALLS = (
    f"echo: <tool_call>{CALL}</tool_call>"
    '<tool_call>{"name": "get_weather", "arguments": {"city": "Oslo"}}</tool_call>'
)


@pytest.mark.parametrize(("parallel", "cities"), [(True, ["Paris", "Oslo"]), (False, ["Paris"])])
async def test_parallel_tool_calls_false_keeps_the_first_call_only(
    fake_server: FakeServer, parallel: bool, cities: list[str]
) -> None:
    client = fake_server.client()

    def stream() -> tuple[list[Any], Any]:
        with client.responses.stream(
            model="fake-model", input=TWO_CALLS, tools=[WEATHER], parallel_tool_calls=parallel
        ) as s:
            return list(s), s.get_final_response()

    events, final = await in_thread(stream)
    assert [json.loads(c.arguments)["city"] for c in final.output] == cities
    assert final.output_text == ""  # the dropped call leaks no markup
    added = [e for e in events if e.type == "response.output_item.added"]
    assert len(added) == len(cities)
    assert final.parallel_tool_calls is parallel


async def test_tool_call_parser_flag_picks_the_format(start_fake_server: Any) -> None:
    server = await start_fake_server(tool_call_parser="mistral")
    client = server.client()
    resp = await in_thread(
        client.responses.create,
        model="fake-model",
        input='echo: [TOOL_CALLS]get_weather[ARGS]{"city": "Paris"}',
        tools=[WEATHER],
    )
    (call,) = resp.output
    assert isinstance(call, ResponseFunctionToolCall)
    assert json.loads(call.arguments) == {"city": "Paris"}
