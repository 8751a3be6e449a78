"""A `function_call_output` (or `custom_tool_call_output`) must answer a call the model
made: one whose `call_id` matches no call in the history or the input is a 400 naming the
item, before any slot is taken, and nothing stored is lost. Over real HTTP with the
`openai` SDK (the fake engine scripts the calls)."""

from __future__ import annotations

from typing import Any

import openai
import pytest
from openai.types.responses import ResponseFunctionToolCall

from support import FakeServer, an_ordinary_request_completes, in_thread

WEATHER = {
    "type": "function",
    "name": "get_weather",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
}
CALL = '<tool_call>{"name": "get_weather", "arguments": {"city": "Paris"}}</tool_call>'


def _output(call_id: str, kind: str = "function_call_output") -> dict[str, Any]:
    return {"type": kind, "call_id": call_id, "output": "sunny"}


async def _first_call(client: openai.OpenAI, **extra: Any) -> tuple[str, str]:
    """A response that calls `get_weather`: its id and the call's `call_id`."""
    first = await in_thread(
        client.responses.create, model="fake-model", input=f"echo: {CALL}", tools=[WEATHER], **extra
    )
    (call,) = first.output
    assert isinstance(call, ResponseFunctionToolCall)
    return first.id, call.call_id


async def _refused(client: openai.OpenAI, param: str, call_id: str, **body: Any) -> None:
    with pytest.raises(openai.BadRequestError) as caught:
        await in_thread(client.responses.create, model="fake-model", tools=[WEATHER], **body)
    assert caught.value.status_code == 400
    error = caught.value.body
    assert isinstance(error, dict)
    assert error["type"] == "invalid_request_error"
    assert error["param"] == param
    assert error["message"] == (
        f"No tool call found for function call output with call_id '{call_id}'."
    )


async def test_an_unknown_call_id_after_a_previous_response_is_a_400(
    fake_server: FakeServer,
) -> None:
    client = fake_server.client()
    first_id, call_id = await _first_call(client)
    await _refused(
        client,
        "input[0].call_id",
        "call_nobody_made",
        previous_response_id=first_id,
        input=[_output("call_nobody_made")],
    )
    await an_ordinary_request_completes(fake_server)
    follow = await in_thread(  # the chain is intact: the right call_id continues it
        client.responses.create,
        model="fake-model",
        tools=[WEATHER],
        previous_response_id=first_id,
        input=[_output(call_id)],
    )
    assert follow.status == "completed"


async def test_the_param_names_the_item_among_several(fake_server: FakeServer) -> None:
    client = fake_server.client()
    first_id, call_id = await _first_call(client)
    await _refused(
        client,
        "input[2].call_id",
        "call_typo",
        previous_response_id=first_id,
        input=[_output(call_id), {"role": "user", "content": "and"}, _output("call_typo")],
        stream=True,
    )
    await an_ordinary_request_completes(fake_server)


async def test_an_unknown_call_id_in_a_conversation_is_a_400(fake_server: FakeServer) -> None:
    client = fake_server.client()
    conversation = await in_thread(client.conversations.create)
    _, call_id = await _first_call(client, conversation=conversation.id)
    await _refused(
        client,
        "input[0].call_id",
        "call_elsewhere",
        conversation=conversation.id,
        input=[_output("call_elsewhere")],
        background=True,
    )
    items = await in_thread(client.conversations.items.list, conversation.id, order="asc")
    assert [i.type for i in items.data] == ["message", "function_call"]  # nothing added
    await in_thread(
        client.responses.create,
        model="fake-model",
        conversation=conversation.id,
        input=[_output(call_id)],
    )
    items = await in_thread(client.conversations.items.list, conversation.id, order="asc")
    assert [i.type for i in items.data][-2:] == ["function_call_output", "message"]
    await an_ordinary_request_completes(fake_server)


async def test_an_output_alone_without_history_is_a_400(fake_server: FakeServer) -> None:
    client = fake_server.client()
    await _refused(
        client,
        "input[1].call_id",
        "call_1",
        input=[{"role": "user", "content": "weather?"}, _output("call_1")],
        store=False,
    )
    await an_ordinary_request_completes(fake_server)


async def test_a_custom_tool_output_with_no_call_is_a_400(fake_server: FakeServer) -> None:
    client = fake_server.client()
    with pytest.raises(openai.BadRequestError) as caught:
        await in_thread(
            client.responses.create,
            model="fake-model",
            input=[{"role": "user", "content": "patch"}, _output("c9", "custom_tool_call_output")],
        )
    error = caught.value.body
    assert isinstance(error, dict)
    assert error["param"] == "input[1].call_id"
    assert error["message"] == "No tool call found for custom tool call output with call_id 'c9'."
    await an_ordinary_request_completes(fake_server)


async def test_a_call_and_its_output_in_the_same_input_are_served(
    fake_server: FakeServer,
) -> None:
    client = fake_server.client()
    call = {"type": "function_call", "call_id": "c1", "name": "get_weather", "arguments": "{}"}
    resp = await in_thread(
        client.responses.create,
        model="fake-model",
        tools=[WEATHER],
        input=[{"role": "user", "content": "weather?"}, call, _output("c1")],
    )
    assert resp.status == "completed"
