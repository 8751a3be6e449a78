"""Hosted tool types (`web_search`, `mcp`, ...) under `--hosted-tools reject|ignore`, over
real HTTP with the `openai` SDK on the fake engine."""

from __future__ import annotations

import logging
from typing import Any

import httpx
import openai
import pytest
from openai.types.responses import ResponseFunctionToolCall

from support import FakeServer, StartServer, in_thread

WEATHER: dict[str, Any] = {
    "type": "function",
    "name": "get_weather",
    "description": "The weather in a city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
}
CALL = '{"name": "get_weather", "arguments": {"city": "Paris"}}'
# What Codex CLI and others send besides their functions.
HOSTED: list[dict[str, Any]] = [
    {"type": "web_search"},
    {"type": "web_search_preview"},
    {"type": "file_search", "vector_store_ids": ["vs_1"]},
    {"type": "image_generation"},
    {"type": "mcp", "server_label": "docs", "server_url": "https://example.com/mcp"},
    {"type": "code_interpreter", "container": {"type": "auto"}},
    {"type": "computer_use_preview", "display_width": 8, "display_height": 8},
    {"type": "local_shell"},
]


@pytest.fixture
async def ignoring(start_fake_server: StartServer) -> FakeServer:
    return await start_fake_server(hosted_tools="ignore")


async def test_reject_names_the_flag_and_the_codex_setting(fake_server: FakeServer) -> None:
    client = fake_server.client()
    with pytest.raises(openai.BadRequestError) as caught:
        await in_thread(
            client.responses.create,
            model="fake-model",
            input="hi",
            tools=[WEATHER, {"type": "web_search"}],
        )
    error = caught.value.body
    assert isinstance(error, dict)
    assert caught.value.status_code == 400
    assert error["param"] == "tools[1].type"
    assert error["type"] == "invalid_request_error"
    assert "--hosted-tools ignore" in error["message"]
    assert 'web_search = "disabled"' in error["message"]
    assert fake_server.engine.prompts == type(fake_server.engine.prompts)()  # nothing ran


async def test_reject_names_the_flag_for_a_tool_choice_naming_a_hosted_type(
    fake_server: FakeServer,
) -> None:
    async with httpx.AsyncClient(timeout=30) as http:
        r = await http.post(
            f"{fake_server.url}/v1/responses",
            json={"model": "fake-model", "input": "x", "tool_choice": {"type": "web_search"}},
        )
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == "tool_choice"
    assert "--hosted-tools ignore" in r.json()["error"]["message"]


@pytest.mark.parametrize("tool", HOSTED, ids=[t["type"] for t in HOSTED])
async def test_reject_is_the_default_for_every_hosted_type(
    fake_server: FakeServer, tool: dict[str, Any]
) -> None:
    async with httpx.AsyncClient(timeout=30) as http:
        r = await http.post(
            f"{fake_server.url}/v1/responses",
            json={"model": "fake-model", "input": "x", "tools": [tool]},
        )
    assert r.status_code == 400, r.text
    assert "--hosted-tools ignore" in r.json()["error"]["message"]


async def test_ignore_answers_and_the_model_never_sees_hosted_tools(ignoring: FakeServer) -> None:
    client = ignoring.client()
    resp = await in_thread(
        client.responses.create,
        model="fake-model",
        input=f"echo: <tool_call>{CALL}</tool_call>",
        tools=[*HOSTED, WEATHER],
    )
    assert resp.status == "completed"
    (call,) = resp.output
    assert isinstance(call, ResponseFunctionToolCall)
    assert call.name == "get_weather"
    prompt = ignoring.engine.prompts[-1]
    assert "get_weather" in prompt
    for tool in HOSTED:
        assert tool["type"] not in prompt
    assert [t.type for t in resp.tools][-2:] == ["local_shell", "function"]  # echoed as sent


async def test_ignore_with_only_hosted_tools_is_a_plain_answer(ignoring: FakeServer) -> None:
    client = ignoring.client()
    resp = await in_thread(
        client.responses.create,
        model="fake-model",
        input="echo: hello there",
        tools=[{"type": "web_search"}],
        stream=False,
    )
    assert resp.output_text == "hello there"
    assert "\x01tools" not in ignoring.engine.prompts[-1]  # no tools rendered at all


async def test_ignore_treats_a_tool_choice_naming_a_hosted_type_as_auto(
    ignoring: FakeServer,
) -> None:
    client = ignoring.client()
    resp = await in_thread(
        client.responses.create,
        model="fake-model",
        input="echo: plain words",
        tools=[{"type": "web_search"}, WEATHER],
        tool_choice={"type": "web_search"},
    )
    assert resp.output_text == "plain words"  # not forced into a call
    alone = await in_thread(
        client.responses.create,
        model="fake-model",
        input="echo: still fine",
        tool_choice={"type": "web_search_preview"},
    )
    assert alone.output_text == "still fine"


async def test_ignore_streams_too(ignoring: FakeServer) -> None:
    client = ignoring.client()

    def stream() -> Any:
        with client.responses.stream(
            model="fake-model", input="echo: streamed", tools=[{"type": "web_search"}]
        ) as s:
            return s.get_final_response()

    final = await in_thread(stream)
    assert final.output_text == "streamed"


async def test_ignore_logs_each_type_once_per_process(
    ignoring: FakeServer, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="mlxcel.prepare.policy")
    client = ignoring.client()
    for _ in range(3):
        await in_thread(
            client.responses.create,
            model="fake-model",
            input="echo: x",
            tools=[{"type": "probe_search_once"}, {"type": "probe_other_once"}],
        )
    lines = [r.getMessage() for r in caplog.records]
    assert sum("probe_search_once" in line for line in lines) == 1
    assert sum("probe_other_once" in line for line in lines) == 1


async def test_ignore_keeps_function_and_namespace_errors(ignoring: FakeServer) -> None:
    async with httpx.AsyncClient(timeout=30) as http:
        r = await http.post(
            f"{ignoring.url}/v1/responses",
            json={
                "model": "fake-model",
                "input": "x",
                "tools": [{"type": "web_search"}, {"type": "function"}],
            },
        )
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == "tools[1].name"  # its place as sent


@pytest.mark.parametrize(
    "tools",
    [
        [{"type": 7}],
        [{"type": None}],
        [{"type": "x" * 100_000}],
        [{"type": "web_search"}] * 5000,
        [{"no_type": True}],
    ],
    ids=["number", "null", "huge-name", "many", "untyped"],
)
async def test_hostile_tool_types_are_dropped_under_ignore(
    ignoring: FakeServer, tools: list[dict[str, Any]]
) -> None:
    async with httpx.AsyncClient(timeout=30) as http:
        r = await http.post(
            f"{ignoring.url}/v1/responses",
            json={"model": "fake-model", "input": "echo: ok", "tools": tools},
        )
    assert r.status_code == 200, r.text
    assert r.json()["output"][0]["content"][0]["text"] == "ok"


async def test_hostile_tool_types_are_400_under_reject(fake_server: FakeServer) -> None:
    async with httpx.AsyncClient(timeout=30) as http:
        r = await http.post(
            f"{fake_server.url}/v1/responses",
            json={"model": "fake-model", "input": "x", "tools": [{"type": "x" * 100_000}]},
        )
    assert r.status_code == 400, r.text
    assert len(r.json()["error"]["message"]) < 1000  # the type is cut short
