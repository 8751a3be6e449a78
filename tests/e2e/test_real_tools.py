"""End to end on the real model: function tools with the `openai` SDK and the Agents SDK."""

from __future__ import annotations

import asyncio
import json

import openai
import pytest
from openai.types.responses import ResponseFunctionToolCall

from server_process import RealServer

pytestmark = pytest.mark.e2e

WEATHER = {
    "type": "function",
    "name": "get_weather",
    "description": "Get the current weather for a city.",
    "parameters": {
        "type": "object",
        "properties": {"city": {"type": "string"}},
        "required": ["city"],
        "additionalProperties": False,
    },
    "strict": True,
}


def test_required_tool_call_sync_and_streamed(real_server: RealServer) -> None:
    client = real_server.client()
    resp = client.responses.create(
        model=real_server.alias,
        input="What is the weather in Paris?",
        tools=[WEATHER],
        tool_choice="required",
        temperature=0,
        max_output_tokens=64,
    )
    call = resp.output[-1]
    assert isinstance(call, ResponseFunctionToolCall)
    assert call.name == "get_weather"
    assert "city" in json.loads(call.arguments)

    deltas = []
    with client.responses.stream(
        model=real_server.alias,
        input="What is the weather in Tokyo?",
        tools=[WEATHER],
        tool_choice={"type": "function", "name": "get_weather"},
        temperature=0,
        max_output_tokens=64,
    ) as stream:
        for event in stream:
            if event.type == "response.function_call_arguments.delta":
                deltas.append(event.delta)
        final = stream.get_final_response()
    streamed_call = final.output[-1]
    assert isinstance(streamed_call, ResponseFunctionToolCall)
    assert "".join(deltas) == streamed_call.arguments
    assert len(deltas) > 1  # the forced call is tagged, so its arguments stream as generated
    assert "city" in json.loads(streamed_call.arguments)
    assert streamed_call.status == "completed"
    assert final.output_text == ""  # the tags never leak into the text

    answer = client.responses.create(
        model=real_server.alias,
        previous_response_id=resp.id,
        tools=[WEATHER],
        input=[{"type": "function_call_output", "call_id": call.call_id, "output": "22 C, sunny"}],
        temperature=0,
        max_output_tokens=48,
    )
    assert answer.status in ("completed", "incomplete")
    assert answer.output_text.strip()


def test_agents_sdk_agent_with_one_tool_runs_to_completion(real_server: RealServer) -> None:
    from agents import Agent, ModelSettings, Runner, function_tool, set_tracing_disabled
    from agents.models.openai_responses import OpenAIResponsesModel

    set_tracing_disabled(True)
    calls: list[str] = []

    @function_tool
    def get_weather(city: str) -> str:
        """Get the current weather for a city."""
        calls.append(city)
        return f"The weather in {city} is 22 C and sunny."

    async def scenario() -> str:
        client = openai.AsyncOpenAI(base_url=f"{real_server.url}/v1", api_key="sk-no-auth")
        agent = Agent(
            name="weather",
            instructions="Use the get_weather tool, then answer in one sentence.",
            tools=[get_weather],
            model=OpenAIResponsesModel(model=real_server.alias, openai_client=client),
            model_settings=ModelSettings(temperature=0, max_tokens=64, tool_choice="required"),
            reset_tool_choice=True,
        )
        result = await Runner.run(agent, "What is the weather in Paris?", max_turns=4)
        await client.close()
        return str(result.final_output)

    final = asyncio.run(scenario())
    assert calls, "the agent never called its tool"
    assert final.strip()
