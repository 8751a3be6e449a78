"""End to end on the real model: LangChain's `ChatOpenAI` as its documentation shows it,
pointed at the server, on Chat Completions and on the Responses API
(`use_responses_api=True`)."""

from __future__ import annotations

import pytest
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, ToolMessage
from langchain_core.tools import tool
from langchain_openai import ChatOpenAI
from pydantic import BaseModel

from server_process import RealServer

pytestmark = pytest.mark.e2e

BOTH_APIS = pytest.mark.parametrize("responses", [False, True], ids=["chat", "responses"])


class City(BaseModel):
    name: str
    country: str


@tool
def get_weather(city: str) -> str:
    """Get the current weather for a city."""
    return f"22 C and sunny in {city}."


def _chat(server: RealServer, responses: bool, max_tokens: int) -> ChatOpenAI:
    return ChatOpenAI(
        base_url=f"{server.url}/v1",
        api_key="sk-no-auth",  # type: ignore[arg-type]
        model=server.alias,
        max_tokens=max_tokens,  # type: ignore[call-arg]
        temperature=0,
        use_responses_api=responses,
    )


@BOTH_APIS
def test_a_call_and_a_stream(real_server: RealServer, responses: bool) -> None:
    llm = _chat(real_server, responses, 16)
    reply = llm.invoke("Reply with: hello")
    assert isinstance(reply, AIMessage)
    assert reply.text.strip()
    assert reply.usage_metadata is not None
    assert reply.usage_metadata["input_tokens"] > 0
    chunks = list(llm.stream("Count to three."))
    assert len(chunks) > 1  # it streamed, not one block at the end
    assert "".join(chunk.text for chunk in chunks).strip()


@BOTH_APIS
def test_a_tool_round_trip(real_server: RealServer, responses: bool) -> None:
    llm = _chat(real_server, responses, 64).bind_tools([get_weather], tool_choice="get_weather")
    messages: list[BaseMessage] = [HumanMessage("What is the weather in Paris?")]
    call_reply = llm.invoke(messages)
    assert isinstance(call_reply, AIMessage)
    (call,) = call_reply.tool_calls
    assert call["name"] == "get_weather"
    assert isinstance(call["args"].get("city"), str)
    assert call["id"]
    result = get_weather.invoke(call["args"])
    messages += [call_reply, ToolMessage(result, tool_call_id=call["id"])]
    answer = _chat(real_server, responses, 32).bind_tools([get_weather]).invoke(messages)
    assert isinstance(answer, AIMessage)  # the server took the call and its result back
    assert answer.text.strip() or answer.tool_calls


@BOTH_APIS
def test_structured_output_with_a_json_schema(real_server: RealServer, responses: bool) -> None:
    llm = _chat(real_server, responses, 48)
    structured = llm.with_structured_output(City, method="json_schema")
    city = structured.invoke("The capital of France, as JSON.")
    assert isinstance(city, City)
    assert city.name.strip()
