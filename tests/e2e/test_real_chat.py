"""End to end on the real model: Chat Completions and Completions with the `openai` SDK."""

from __future__ import annotations

import asyncio
import json

import openai
import pytest
from pydantic import BaseModel

from server_process import RealServer

pytestmark = pytest.mark.e2e

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Get the current weather for a city.",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}},
            "required": ["city"],
            "additionalProperties": False,
        },
    },
}


def test_a_chat_completion_and_its_stream(real_server: RealServer) -> None:
    client = real_server.client()
    completion = client.chat.completions.create(
        model=real_server.alias,
        messages=[{"role": "user", "content": "What is the capital of France? One word."}],
        temperature=0,
        max_tokens=8,
    )
    assert "paris" in (completion.choices[0].message.content or "").lower()
    assert completion.usage is not None
    assert completion.usage.prompt_tokens > 10

    stream = client.chat.completions.create(
        model=real_server.alias,
        messages=[{"role": "user", "content": "Count: 1, 2, 3, 4, 5, 6"}],
        temperature=0,
        max_tokens=24,
        stop=["5"],
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert "5" not in text
    assert "4" in text
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "stop"
    assert chunks[-1].usage is not None
    assert chunks[-1].usage.completion_tokens < 24


def test_a_forced_tool_call_streams_its_arguments(real_server: RealServer) -> None:
    client = real_server.client()
    with client.chat.completions.stream(
        model=real_server.alias,
        messages=[{"role": "user", "content": "What is the weather in Paris?"}],
        tools=[WEATHER],  # type: ignore[list-item]
        tool_choice={"type": "function", "function": {"name": "get_weather"}},
        temperature=0,
        max_tokens=48,
    ) as stream:
        final = stream.get_final_completion()
    [choice] = final.choices
    assert choice.finish_reason == "tool_calls"
    [call] = choice.message.tool_calls
    assert call.function.name == "get_weather"
    assert "paris" in json.loads(call.function.arguments)["city"].lower()


class Capital(BaseModel):
    country: str
    capital: str


def test_logprobs_come_with_tools_offered(real_server: RealServer) -> None:
    client = real_server.client()
    completion = client.chat.completions.create(
        model=real_server.alias,
        messages=[{"role": "user", "content": "Count: one, two,"}],
        tools=[WEATHER],  # type: ignore[list-item]
        temperature=0,
        max_tokens=6,
        logprobs=True,
    )
    [choice] = completion.choices
    assert choice.message.content
    assert choice.logprobs is not None
    tokens = [entry.token for entry in choice.logprobs.content or []]
    assert "".join(tokens) == choice.message.content


def test_structured_output_through_parse(real_server: RealServer) -> None:
    client = real_server.client()
    completion = client.chat.completions.parse(
        model=real_server.alias,
        messages=[{"role": "user", "content": "The capital of Italy, as JSON."}],
        response_format=Capital,
        temperature=0,
        max_tokens=40,
    )
    parsed = completion.choices[0].message.parsed
    assert parsed is not None
    assert parsed.capital.lower() == "rome"


def test_a_raw_completion(real_server: RealServer) -> None:
    client = real_server.client()
    completion = client.completions.create(
        model=real_server.alias, prompt="def add(a, b):\n    return", temperature=0, max_tokens=6
    )
    assert "a + b" in completion.choices[0].text


@pytest.mark.parametrize("prompt", ["", [""]], ids=["empty", "one-empty"])
def test_an_empty_raw_prompt_is_a_400_and_the_server_serves_on(
    real_server: RealServer, prompt: str | list[str]
) -> None:
    """No token to read used to fail on the model thread: a 500 and a traceback."""
    client = real_server.client()
    with pytest.raises(openai.BadRequestError) as refused:
        client.completions.create(model=real_server.alias, prompt=prompt, max_tokens=4)
    assert (refused.value.param, refused.value.code) == ("prompt", "invalid_value")
    with real_server.http() as http:
        assert http.get("/health").status_code == 200
    completion = client.completions.create(
        model=real_server.alias, prompt="1, 2, 3,", temperature=0, max_tokens=2
    )
    assert completion.choices[0].text
    assert "Traceback" not in real_server.log.read_text()


def test_agents_sdk_chat_completions_model_runs_a_tool_loop(real_server: RealServer) -> None:
    from agents import Agent, ModelSettings, Runner, function_tool, set_tracing_disabled
    from agents.models.openai_chatcompletions import OpenAIChatCompletionsModel

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
            model=OpenAIChatCompletionsModel(model=real_server.alias, openai_client=client),
            model_settings=ModelSettings(temperature=0, max_tokens=64, tool_choice="required"),
            reset_tool_choice=True,
        )
        try:
            result = await Runner.run(agent, "What is the weather in Paris?", max_turns=4)
        finally:
            await client.close()
        return str(result.final_output)

    final = asyncio.run(scenario())
    assert calls, "the agent never called its tool"
    assert final.strip()  # the model answered after the tool's output
