"""End to end on the real model: a Pydantic AI `Agent` as its documentation shows it, on
`OpenAIChatModel` (Chat Completions) and on `OpenAIResponsesModel` (the Responses API),
with an `OpenAIProvider` pointed at the server."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import openai
import pytest
from pydantic import BaseModel
from pydantic_ai import Agent, NativeOutput
from pydantic_ai.models import Model
from pydantic_ai.models.openai import OpenAIChatModel, OpenAIResponsesModel
from pydantic_ai.providers.openai import OpenAIProvider
from pydantic_ai.settings import ModelSettings

from server_process import RealServer

pytestmark = pytest.mark.e2e

T = TypeVar("T")
ModelClass = type[OpenAIChatModel] | type[OpenAIResponsesModel]
BOTH_MODELS = pytest.mark.parametrize(
    "model_class", [OpenAIChatModel, OpenAIResponsesModel], ids=["chat", "responses"]
)


class City(BaseModel):
    name: str
    country: str


def _run(
    server: RealServer, model_class: ModelClass, scenario: Callable[[Model], Awaitable[T]]
) -> T:
    """`scenario` on a model of `model_class` for `server`, its client closed after."""

    async def run() -> T:
        client = openai.AsyncOpenAI(base_url=f"{server.url}/v1", api_key="sk-no-auth")
        try:
            model = model_class(server.alias, provider=OpenAIProvider(openai_client=client))
            return await scenario(model)
        finally:
            await client.close()

    return asyncio.run(run())


def _settings(max_tokens: int) -> ModelSettings:
    return ModelSettings(max_tokens=max_tokens, temperature=0)


@BOTH_MODELS
def test_a_run_and_a_stream(real_server: RealServer, model_class: ModelClass) -> None:
    async def scenario(model: Model) -> tuple[str, int, list[str]]:
        agent = Agent(model, model_settings=_settings(16))
        result = await agent.run("Reply with: hello")
        async with agent.run_stream("Count to three.") as stream:
            deltas = [delta async for delta in stream.stream_text(delta=True)]
        return result.output, result.usage.input_tokens, deltas

    output, input_tokens, deltas = _run(real_server, model_class, scenario)
    assert output.strip()
    assert input_tokens > 0
    assert len(deltas) > 1  # it streamed, not one block at the end
    assert "".join(deltas).strip()


@BOTH_MODELS
def test_an_agent_calls_its_tool(real_server: RealServer, model_class: ModelClass) -> None:
    calls: list[str] = []

    async def scenario(model: Model) -> str:
        agent = Agent(
            model,
            instructions="Use the get_weather tool, then answer in one sentence.",
            model_settings=_settings(64),
        )

        @agent.tool_plain
        def get_weather(city: str) -> str:
            """Get the current weather for a city."""
            calls.append(city)
            return f"22 C and sunny in {city}."

        result = await agent.run("What is the weather in Paris?")
        return result.output

    output = _run(real_server, model_class, scenario)
    assert calls, "the agent never called its tool"
    assert output.strip()  # the tool's result went back and the run finished


@BOTH_MODELS
@pytest.mark.parametrize("native", [False, True], ids=["tool_output", "native_output"])
def test_structured_output(real_server: RealServer, model_class: ModelClass, native: bool) -> None:
    """`output_type=City`: as a forced output tool by default, or as a `json_schema`
    response format with `NativeOutput`; either way the server's grammar holds the JSON."""
    output_type: Any = NativeOutput(City) if native else City

    async def scenario(model: Model) -> object:
        agent = Agent(model, output_type=output_type, model_settings=_settings(64))
        return (await agent.run("The capital of France.")).output

    city = _run(real_server, model_class, scenario)
    assert isinstance(city, City)
    assert city.name.strip()
