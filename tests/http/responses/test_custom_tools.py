"""`custom` tools (free-form input, as Codex CLI's `apply_patch`) over real HTTP with the
`openai` SDK; the fake engine scripts the model's calls and records the prompt it got."""

from __future__ import annotations

import json
from typing import Any

import pytest
from openai.types.responses import (
    ResponseCustomToolCall,
    ResponseFunctionToolCall,
    ToolChoiceCustom,
)

from support import FakeServer, in_thread, post

GRAMMAR = 'start: "*** Begin Patch" LF body "*** End Patch"\nbody: /(?s:.*)/\n%import common.LF'
APPLY_PATCH: dict[str, Any] = {
    "type": "custom",
    "name": "apply_patch",
    "description": "Edit files with a patch.",
    "format": {"type": "grammar", "syntax": "lark", "definition": GRAMMAR},
}
PATCH = '*** Begin Patch\n*** Add File: a.txt\n+hi "there"\n*** End Patch'
CALL = json.dumps({"name": "apply_patch", "arguments": {"input": PATCH}})


def rendered_tools(prompt: str) -> list[dict[str, Any]]:
    """The tool definitions the fake codec rendered at the head of the prompt."""
    assert prompt.startswith("\x01tools\x02"), prompt[:80]
    tools: list[dict[str, Any]] = json.loads(prompt.split("\x01")[1].removeprefix("tools\x02"))
    return tools


def rendered_calls(prompt: str) -> list[dict[str, Any]]:
    """The tool calls of every assistant turn the fake codec rendered."""
    calls: list[dict[str, Any]] = []
    for turn in prompt.split("\x01assistant\x02")[1:]:
        if "\x03" in turn:
            calls += json.loads(turn.split("\x03", 1)[1].split("\x01", 1)[0])
    return calls


async def test_a_custom_call_is_a_custom_tool_call_item(fake_server: FakeServer) -> None:
    client = fake_server.client()
    resp = await in_thread(
        client.responses.create,
        model="fake-model",
        input=f"echo: Patching. <tool_call>{CALL}</tool_call>",
        tools=[APPLY_PATCH],
    )
    assert [item.type for item in resp.output] == ["message", "custom_tool_call"]
    call = resp.output[1]
    assert isinstance(call, ResponseCustomToolCall)
    assert (call.name, call.input) == ("apply_patch", PATCH)
    assert call.call_id.startswith("call_")
    assert call.id is not None
    assert call.id.startswith("ctc_")
    assert resp.tools[0].type == "custom"
    # The model saw a function of one string, with the grammar in its description.
    (offered,) = rendered_tools(fake_server.engine.last_prompt)
    function = offered["function"]
    assert function["name"] == "apply_patch"
    assert function["parameters"]["properties"]["input"]["type"] == "string"
    assert function["parameters"]["required"] == ["input"]
    assert function["description"].startswith("Edit files with a patch.")
    assert GRAMMAR in function["description"]
    assert "lark" in function["description"]


async def test_a_streamed_custom_call(fake_server: FakeServer) -> None:
    client = fake_server.client()

    def stream() -> tuple[list[Any], Any]:
        with client.responses.stream(
            model="fake-model", input=f"echo: <tool_call>{CALL}</tool_call>", tools=[APPLY_PATCH]
        ) as s:
            return list(s), s.get_final_response()

    events, final = await in_thread(stream)
    types = [e.type for e in events]
    assert not [t for t in types if t.startswith("response.function_call_arguments")]
    deltas = "".join(e.delta for e in events if e.type == "response.custom_tool_call_input.delta")
    (done,) = [e for e in events if e.type == "response.custom_tool_call_input.done"]
    (call,) = final.output
    assert isinstance(call, ResponseCustomToolCall)
    assert deltas == done.input == call.input == PATCH
    assert types.count("response.custom_tool_call_input.delta") > 1  # streamed as written
    assert done.item_id == call.id
    added = next(e for e in events if e.type == "response.output_item.added")
    item_done = next(e for e in events if e.type == "response.output_item.done")
    assert added.item.type == item_done.item.type == "custom_tool_call"
    assert item_done.item.input == PATCH
    assert added.item.id == item_done.item.id == call.id
    assert types[-1] == "response.completed"
    assert [e.sequence_number for e in events] == list(range(len(events)))


async def test_calls_and_outputs_go_back_as_input(fake_server: FakeServer) -> None:
    client = fake_server.client()
    call = {
        "type": "custom_tool_call",
        "call_id": "call_7",
        "name": "apply_patch",
        "input": PATCH,
    }
    output = [{"type": "input_text", "text": "Done"}, {"type": "input_text", "text": "!"}]
    resp = await in_thread(
        client.responses.create,
        model="fake-model",
        tools=[APPLY_PATCH],
        input=[
            {"role": "user", "content": "add a.txt"},
            call,
            {"type": "custom_tool_call_output", "call_id": "call_7", "output": output},
        ],
    )
    assert resp.status == "completed"
    prompt = fake_server.engine.last_prompt
    (rendered,) = rendered_calls(prompt)
    assert rendered["id"] == "call_7"
    assert rendered["function"] == {"name": "apply_patch", "arguments": {"input": PATCH}}
    assert "\x01tool\x02Done!" in prompt
    items = await in_thread(client.responses.input_items.list, resp.id, order="asc")
    assert [i.type for i in items.data] == [
        "message",
        "custom_tool_call",
        "custom_tool_call_output",
    ]
    echoed = items.data[1]
    assert isinstance(echoed, ResponseCustomToolCall)
    assert (echoed.call_id, echoed.input) == ("call_7", PATCH)
    sent = items.data[2].output  # type: ignore[union-attr]
    assert [p.text for p in sent] == ["Done", "!"]  # kept as sent: a list of parts


async def test_a_chain_replays_the_call_and_its_output(fake_server: FakeServer) -> None:
    client = fake_server.client()
    first = await in_thread(
        client.responses.create, model="fake-model", input=f"echo: {CALL}", tools=[APPLY_PATCH]
    )
    (call,) = first.output
    assert isinstance(call, ResponseCustomToolCall)
    follow = await in_thread(
        client.responses.create,
        model="fake-model",
        tools=[APPLY_PATCH],
        previous_response_id=first.id,
        input=[{"type": "custom_tool_call_output", "call_id": call.call_id, "output": "Applied"}],
    )
    assert follow.status == "completed"
    prompt = fake_server.engine.last_prompt
    (rendered,) = rendered_calls(prompt)
    assert rendered["id"] == call.call_id
    assert rendered["function"]["arguments"] == {"input": PATCH}
    assert prompt.endswith("\x01tool\x02Applied\x00ASSISTANT\x00")


async def test_a_conversation_keeps_the_call_and_its_output(fake_server: FakeServer) -> None:
    client = fake_server.client()
    conversation = await in_thread(client.conversations.create)
    first = await in_thread(
        client.responses.create,
        model="fake-model",
        input=f"echo: {CALL}",
        tools=[APPLY_PATCH],
        conversation=conversation.id,
    )
    (call,) = first.output
    assert isinstance(call, ResponseCustomToolCall)
    await in_thread(
        client.responses.create,
        model="fake-model",
        tools=[APPLY_PATCH],
        tool_choice="none",
        conversation=conversation.id,
        input=[{"type": "custom_tool_call_output", "call_id": call.call_id, "output": "Applied"}],
    )
    (rendered,) = rendered_calls(fake_server.engine.last_prompt)
    assert rendered["function"]["arguments"] == {"input": PATCH}
    items = await in_thread(client.conversations.items.list, conversation.id, order="asc")
    kinds = [i.type for i in items.data]
    assert kinds == ["message", "custom_tool_call", "custom_tool_call_output", "message"]
    assert items.data[1].input == PATCH  # type: ignore[union-attr]


async def test_tool_choice_custom_forces_the_tool(fake_server: FakeServer) -> None:
    client = fake_server.client()
    weather = {"type": "function", "name": "get_weather", "parameters": {"type": "object"}}
    resp = await in_thread(
        client.responses.create,
        model="fake-model",
        input=f"echo: {CALL}",
        tools=[weather, APPLY_PATCH],
        tool_choice={"type": "custom", "name": "apply_patch"},
    )
    (call,) = resp.output
    assert isinstance(call, ResponseCustomToolCall)
    assert call.input == PATCH
    assert isinstance(resp.tool_choice, ToolChoiceCustom)
    assert resp.tool_choice.name == "apply_patch"


@pytest.mark.parametrize(
    ("arguments", "expected"),
    [
        ({"patch": "raw text"}, "raw text"),  # a lone string under another name
        ({"input": 5}, '{"input": 5}'),  # not a string: the arguments as written
    ],
)
async def test_arguments_that_are_not_a_string_input_are_read_leniently(
    fake_server: FakeServer, arguments: dict[str, Any], expected: str
) -> None:
    client = fake_server.client()
    call = json.dumps({"name": "apply_patch", "arguments": arguments})
    resp = await in_thread(
        client.responses.create,
        model="fake-model",
        input=f"echo: <tool_call>{call}</tool_call>",
        tools=[APPLY_PATCH],
    )
    (item,) = resp.output
    assert isinstance(item, ResponseCustomToolCall)
    assert item.input == expected


async def test_custom_and_function_tools_side_by_side(fake_server: FakeServer) -> None:
    client = fake_server.client()
    weather = {"type": "function", "name": "get_weather", "parameters": {"type": "object"}}
    function_call = '{"name": "get_weather", "arguments": {}}'
    resp = await in_thread(
        client.responses.create,
        model="fake-model",
        input=f"echo: <tool_call>{function_call}</tool_call> <tool_call>{CALL}</tool_call>",
        tools=[weather, {"type": "custom", "name": "apply_patch"}],
    )
    assert isinstance(resp.output[0], ResponseFunctionToolCall)
    assert isinstance(resp.output[1], ResponseCustomToolCall)
    offered = rendered_tools(fake_server.engine.last_prompt)
    assert offered[1]["function"]["description"] == ""  # no format: free text


@pytest.mark.parametrize(
    ("extra", "param"),
    [
        ({"tools": [{"type": "custom"}]}, "tools[0].name"),
        ({"tools": [{"type": "custom", "name": ""}]}, "tools[0].name"),
        (
            {"tools": [{"type": "function", "name": "apply_patch"}, APPLY_PATCH]},
            "tools",
        ),
        ({"tools": [APPLY_PATCH, APPLY_PATCH]}, "tools"),
        ({"tools": [{**APPLY_PATCH, "format": "lark"}]}, "tools[0].format"),
        (
            {"tools": [{**APPLY_PATCH, "format": {"type": "grammar", "syntax": "ebnf"}}]},
            "tools[0].format",
        ),
        ({"tools": [{**APPLY_PATCH, "description": ["x"]}]}, "tools[0].description"),
        (
            {
                "tools": [
                    {**APPLY_PATCH, "format": {**APPLY_PATCH["format"], "definition": "start: x"}}
                ]
            },
            "tools[0].format.definition",
        ),
        (
            {
                "tools": [
                    {
                        **APPLY_PATCH,
                        "format": {"type": "grammar", "syntax": "regex", "definition": "(a"},
                    }
                ]
            },
            "tools[0].format.definition",
        ),
        (
            {"tools": [APPLY_PATCH], "tool_choice": {"type": "custom", "name": "nope"}},
            "tool_choice",
        ),
        ({"tools": [APPLY_PATCH], "tool_choice": {"type": "custom"}}, "tool_choice"),
        (
            {"tools": [APPLY_PATCH], "tool_choice": {"type": "function", "name": "apply_patch"}},
            "tool_choice.type",
        ),
        (
            {
                "tools": [APPLY_PATCH, {"type": "function", "name": "run"}],
                "tool_choice": {"type": "custom", "name": "run"},
            },
            "tool_choice.type",
        ),
        (
            {"tools": [{**APPLY_PATCH, "description": "x" * 300_000}]},
            "input",  # more than the context window could hold
        ),
    ],
)
async def test_bad_custom_tools_are_400(
    fake_server: FakeServer, extra: dict[str, Any], param: str
) -> None:
    r = await post(fake_server, "/v1/responses", {"model": "fake-model", "input": "x", **extra})
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["param"] == param
    assert error["type"] == "invalid_request_error"


CALL_ITEM = {"type": "custom_tool_call", "call_id": "c", "name": "apply_patch", "input": "x"}


@pytest.mark.parametrize(
    "item",
    [
        {"type": "custom_tool_call_output", "call_id": "c", "output": 5},
        {"type": "custom_tool_call_output", "call_id": "c", "output": {"text": "x"}},
        {"type": "custom_tool_call_output", "call_id": "c", "output": [{"type": "nope"}]},
        {"type": "custom_tool_call_output", "output": "x"},
        {k: v for k, v in CALL_ITEM.items() if k != "input"},
        {**CALL_ITEM, "input": {"patch": "x"}},
        {**CALL_ITEM, "name": None},
    ],
)
async def test_bad_custom_items_are_400(fake_server: FakeServer, item: dict[str, Any]) -> None:
    body = {"model": "fake-model", "input": [{"role": "user", "content": "x"}, item]}
    r = await post(fake_server, "/v1/responses", body)
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["param"].startswith("input[1]")


async def test_a_namespaced_custom_tool(fake_server: FakeServer) -> None:
    client = fake_server.client()
    edit = {"type": "namespace", "name": "edit", "description": "Editing.", "tools": [APPLY_PATCH]}
    call = json.dumps({"name": "edit__apply_patch", "arguments": {"input": PATCH}})
    resp = await in_thread(
        client.responses.create,
        model="fake-model",
        input=f"echo: <tool_call>{call}</tool_call>",
        tools=[edit],
    )
    (item,) = resp.output
    assert isinstance(item, ResponseCustomToolCall)
    assert (item.namespace, item.name, item.input) == ("edit", "apply_patch", PATCH)
    follow = await in_thread(
        client.responses.create,
        model="fake-model",
        tools=[edit],
        tool_choice="none",
        input=[
            {"role": "user", "content": "patch it"},
            item.model_dump(exclude_none=True),
            {"type": "custom_tool_call_output", "call_id": item.call_id, "output": "ok"},
        ],
    )
    assert follow.status == "completed"
    (rendered,) = rendered_calls(fake_server.engine.last_prompt)
    assert rendered["function"] == {"name": "edit__apply_patch", "arguments": {"input": PATCH}}


async def test_a_cut_off_custom_call_is_not_kept(fake_server: FakeServer) -> None:
    client = fake_server.client()

    def stream() -> list[Any]:
        with client.responses.stream(
            model="fake-model",
            input=f"echo: <tool_call>{CALL}</tool_call>",
            tools=[APPLY_PATCH],
            max_output_tokens=4,
        ) as s:
            return list(s)

    events = await in_thread(stream)
    final = events[-1].response
    assert final.status == "incomplete"
    assert [item.type for item in final.output] == ["message"]  # the call is not kept
    done = next(e for e in events if e.type == "response.output_item.done")
    assert done.item.type == "custom_tool_call"
    assert done.item.status == "incomplete"
    assert events[-1].type == "response.incomplete"
