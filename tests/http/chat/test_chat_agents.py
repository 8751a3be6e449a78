"""The OpenAI Agents SDK over `/v1/chat/completions` (fake engine): a tool loop."""

from __future__ import annotations

import asyncio
from typing import Any

import openai

from support import FakeServer, in_thread

CALL = '{"name": "get_weather", "arguments": {"city": "Paris"}}'


async def test_agents_sdk_chat_completions_model_runs_a_tool(fake_server: FakeServer) -> None:
    from agents import Agent, Runner, function_tool, set_tracing_disabled
    from agents.models.openai_chatcompletions import OpenAIChatCompletionsModel

    set_tracing_disabled(True)
    asked: list[str] = []

    @function_tool
    def get_weather(city: str) -> str:
        """The weather in a city."""
        asked.append(city)
        return f"sunny in {city}"

    async def scenario() -> Any:
        client = openai.AsyncOpenAI(base_url=f"{fake_server.url}/v1", api_key="sk-no-auth")
        agent = Agent(
            name="weather",
            instructions="Answer with the tool.",
            model=OpenAIChatCompletionsModel(model="fake-model", openai_client=client),
            tools=[get_weather],
            tool_use_behavior="stop_on_first_tool",
        )
        try:
            # The fake answers the last user message: a call to the tool.
            return await Runner.run(agent, f"echo: <tool_call>{CALL}</tool_call>", max_turns=3)
        finally:
            await client.close()

    result = await in_thread(asyncio.run, scenario())
    assert asked == ["Paris"]
    assert result.final_output == "sunny in Paris"
