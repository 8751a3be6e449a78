"""`/v1/chat/completions` over real HTTP with the `openai` SDK (the fake engine scripts
the replies: `echo: TEXT` answers TEXT, one word per token)."""

from __future__ import annotations

import json
from typing import Any

import httpx
import openai
import pytest
import trio
from pydantic import BaseModel

from mlxcel.model.fake import FakeEngine

from support import (
    LONG,
    FakeServer,
    StartServer,
    an_ordinary_request_completes,
    in_thread,
    raw_request,
    read_until,
)

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather in a city.",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}},
            "required": ["city"],
        },
    },
}
CALL = '{"name": "get_weather", "arguments": {"city": "Paris"}}'


def user(text: str) -> list[dict[str, Any]]:
    return [{"role": "user", "content": text}]


async def test_a_chat_completion_answers_the_last_user_message(fake_server: FakeServer) -> None:
    client = fake_server.client()
    completion = await in_thread(
        client.chat.completions.create,
        model="fake-model",
        messages=[
            {"role": "system", "content": "Be brief."},
            {"role": "developer", "content": [{"type": "text", "text": "Really."}]},
            {"role": "user", "content": [{"type": "text", "text": "echo: hello there"}]},
        ],
    )
    assert completion.object == "chat.completion"
    assert completion.id.startswith("chatcmpl-")
    assert completion.model == "fake-model"
    [choice] = completion.choices
    assert (choice.message.role, choice.message.content) == ("assistant", "hello there")
    assert choice.finish_reason == "stop"
    assert choice.message.tool_calls is None
    usage = completion.usage
    assert usage is not None
    assert usage.completion_tokens == 2
    assert usage.total_tokens == usage.prompt_tokens + 2
    assert usage.prompt_tokens_details is not None
    assert usage.prompt_tokens_details.cached_tokens == 0
    assert usage.completion_tokens_details is not None
    assert usage.completion_tokens_details.reasoning_tokens == 0


async def test_max_tokens_cuts_the_reply_with_finish_reason_length(
    fake_server: FakeServer,
) -> None:
    client = fake_server.client()
    for field in ("max_tokens", "max_completion_tokens"):
        completion = await in_thread(
            client.chat.completions.create,
            model="fake-model",
            messages=user("echo: one two three four"),
            **{field: 2},
        )
        assert completion.choices[0].message.content == "one two"
        assert completion.choices[0].finish_reason == "length"


async def test_a_stream_with_usage_ends_with_a_usage_chunk(fake_server: FakeServer) -> None:
    client = fake_server.client()

    def run() -> list[Any]:
        stream = client.chat.completions.create(
            model="fake-model",
            messages=user("echo: a b c"),
            stream=True,
            stream_options={"include_usage": True},
        )
        return list(stream)

    chunks = await in_thread(run)
    assert all(c.object == "chat.completion.chunk" for c in chunks)
    assert len({c.id for c in chunks}) == 1
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == "a b c"
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices]
    assert finishes[-1] == "stop"
    assert set(finishes[:-1]) == {None}
    assert chunks[-1].choices == []
    assert chunks[-1].usage is not None
    assert chunks[-1].usage.completion_tokens == 3
    assert all(c.usage is None for c in chunks[:-1])


async def test_a_tool_call_is_returned_as_tool_calls(fake_server: FakeServer) -> None:
    client = fake_server.client()
    completion = await in_thread(
        client.chat.completions.create,
        model="fake-model",
        messages=user(f"echo: <tool_call>{CALL}</tool_call>"),
        tools=[WEATHER],
    )
    [choice] = completion.choices
    assert choice.finish_reason == "tool_calls"
    assert choice.message.content is None
    [call] = choice.message.tool_calls or []
    assert call.id.startswith("call_")
    assert call.function.name == "get_weather"  # type: ignore[union-attr]
    assert json.loads(call.function.arguments) == {"city": "Paris"}  # type: ignore[union-attr]


async def test_streamed_tool_call_deltas_add_up_in_the_stream_helper(
    fake_server: FakeServer,
) -> None:
    client = fake_server.client()

    def run() -> tuple[list[Any], Any]:
        with client.chat.completions.stream(
            model="fake-model",
            messages=user(f"echo: Checking. <tool_call>{CALL}</tool_call>"),
            tools=[WEATHER],
        ) as stream:
            return list(stream), stream.get_final_completion()

    events, final = await in_thread(run)
    deltas = [e for e in events if e.type == "tool_calls.function.arguments.delta"]
    assert len(deltas) > 1
    assert json.loads("".join(d.arguments_delta for d in deltas)) == {"city": "Paris"}
    [choice] = final.choices
    assert choice.finish_reason == "tool_calls"
    assert (choice.message.content or "").strip() == "Checking."
    [call] = choice.message.tool_calls
    assert call.function.name == "get_weather"
    assert call.function.parsed_arguments is None or call.function.parsed_arguments == {
        "city": "Paris"
    }


async def test_a_tool_round_trip_renders_the_call_and_its_output(fake_server: FakeServer) -> None:
    client = fake_server.client()

    def ask(output: str) -> Any:
        return client.chat.completions.create(
            model="fake-model",
            messages=[
                {"role": "user", "content": "Weather in Paris?"},
                {
                    "role": "assistant",
                    "content": None,
                    "tool_calls": [
                        {
                            "id": "call_1",
                            "type": "function",
                            "function": {"name": "get_weather", "arguments": '{"city":"Paris"}'},
                        }
                    ],
                },
                {"role": "tool", "tool_call_id": "call_1", "content": output},
                {"role": "user", "content": "echo: thanks"},
            ],
            tools=[WEATHER],
        )

    short, long = await in_thread(ask, "sunny"), await in_thread(ask, "sunny and warm")
    assert short.choices[0].message.content == "thanks"
    # The fake renders one token per character: the tool's output is in the prompt.
    assert long.usage.prompt_tokens - short.usage.prompt_tokens == len(" and warm")


class Weather(BaseModel):
    city: str
    celsius: int


async def test_parse_with_a_pydantic_model(fake_server: FakeServer) -> None:
    client = fake_server.client()
    completion = await in_thread(
        client.chat.completions.parse,
        model="fake-model",
        messages=user('echo: {"city": "Paris", "celsius": 21}'),
        response_format=Weather,
    )
    assert completion.choices[0].message.parsed == Weather(city="Paris", celsius=21)


async def test_logprobs_come_with_their_alternatives(fake_server: FakeServer) -> None:
    client = fake_server.client()
    completion = await in_thread(
        client.chat.completions.create,
        model="fake-model",
        messages=user("echo: a b"),
        logprobs=True,
        top_logprobs=2,
    )
    logprobs = completion.choices[0].logprobs
    assert logprobs is not None
    content = logprobs.content or []
    assert [(e.token, e.logprob) for e in content] == [("a", -0.5), (" b", -0.5)]
    assert [t.token for t in content[1].top_logprobs] == [" b", "alt1"]


async def test_logprobs_are_kept_when_tools_are_offered(fake_server: FakeServer) -> None:
    """The text before a call keeps its tokens' logprobs; the call's own tokens have none
    (a token that begins the markup after some text counts as that text's)."""
    client = fake_server.client()
    completion = await in_thread(
        client.chat.completions.create,
        model="fake-model",
        messages=user(f"echo: a b <tool_call>{CALL}</tool_call>"),
        tools=[WEATHER],
        logprobs=True,
    )
    [choice] = completion.choices
    assert choice.finish_reason == "tool_calls"
    assert choice.logprobs is not None
    tokens = [e.token for e in choice.logprobs.content or []]
    assert tokens[:2] == ["a", " b"]
    assert "Paris" not in "".join(tokens)  # tokens wholly inside the call are dropped


async def test_a_stop_string_ends_the_reply_before_it(fake_server: FakeServer) -> None:
    client = fake_server.client()
    completion = await in_thread(
        client.chat.completions.create, model="fake-model", messages=user("hi"), stop="fox"
    )
    assert completion.choices[0].message.content == "The quick brown "
    assert completion.choices[0].finish_reason == "stop"
    assert completion.usage is not None
    assert completion.usage.completion_tokens == 4  # generation stopped there


async def test_a_stop_string_across_tokens_is_never_streamed(fake_server: FakeServer) -> None:
    client = fake_server.client()

    def run() -> list[Any]:
        return list(
            client.chat.completions.create(
                model="fake-model",
                messages=user("hi"),
                stop=["nothing", "brown f"],
                stream=True,
            )
        )

    chunks = await in_thread(run)
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == "The quick "
    assert chunks[-1].choices[0].finish_reason == "stop"


@pytest.mark.parametrize(
    ("change", "param"),
    [
        pytest.param({"n": 9}, "n", id="n-above-the-bound"),
        pytest.param({"messages": []}, "messages", id="empty-messages"),
        pytest.param({"messages": [{"role": "wizard", "content": "x"}]}, "messages[0]", id="role"),
        pytest.param({"messages": [{"role": "assistant"}]}, "messages[0].content", id="empty"),
        pytest.param(
            {"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}]},
            "messages[0]",
            id="image",
        ),
        pytest.param({"top_logprobs": 2}, "top_logprobs", id="top-logprobs-alone"),
        pytest.param({"stop": ["a", "b", "c", "d", "e"]}, "stop", id="five-stops"),
        pytest.param({"temperature": 3}, "temperature", id="temperature"),
        pytest.param({"tools": [{"type": "web_search"}]}, "tools[0]", id="hosted-tool"),
        pytest.param({"tool_choice": "required"}, "tool_choice", id="required-without-tools"),
        pytest.param(
            {
                "response_format": {
                    "type": "json_schema",
                    "json_schema": {"name": "x", "schema": {"type": 7}},
                }
            },
            "response_format",
            id="bad-schema",
        ),
        pytest.param({"model": "other-model"}, "model", id="model"),
        pytest.param({"seed": 2**64}, "seed", id="seed"),
    ],
)
async def test_bad_fields_are_openai_shaped_4xx(
    fake_server: FakeServer, change: dict[str, Any], param: str
) -> None:
    body = {"model": "fake-model", "messages": user("hi")} | change
    async with httpx.AsyncClient(base_url=fake_server.url, timeout=30) as http:
        r = await http.post("/v1/chat/completions", json=body)
    assert r.status_code in (400, 404), r.text
    error = r.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["type"] == "invalid_request_error"
    assert (error["param"] or "").startswith(param), error


async def test_the_root_route_answers_too(fake_server: FakeServer) -> None:
    body = {"model": "fake-model", "messages": user("echo: root")}
    async with httpx.AsyncClient(base_url=fake_server.url, timeout=30) as http:
        r = await http.post("/chat/completions", json=body)
    assert r.json()["choices"][0]["message"]["content"] == "root"


async def test_hanging_up_mid_stream_frees_the_slot(start_fake_server: StartServer) -> None:
    engine = FakeEngine()
    engine.hold(on="w0")  # the long stream runs until its client hangs up; the others run
    server = await start_fake_server(engine, parallel=1, max_queue_depth=0)
    body = {"model": "fake-model", "messages": user(LONG), "stream": True}
    stream = await raw_request(server.url, body, path="/v1/chat/completions")
    await read_until(stream, b"w0")
    await stream.aclose()
    await an_ordinary_request_completes(server)
    async with httpx.AsyncClient(base_url=server.url, timeout=30) as http:
        with trio.fail_after(10):
            while (await http.get("/health")).json()["slots"]["busy"]:  # noqa: ASYNC110 - polled over HTTP
                await trio.sleep(0.01)


async def test_an_engine_failure_is_a_server_error_sync_and_streamed(
    start_fake_server: StartServer,
) -> None:
    server = await start_fake_server(FakeEngine(fail_on="poison"))
    client = server.client()
    with pytest.raises(openai.InternalServerError) as sync_error:
        await in_thread(
            client.chat.completions.create, model="fake-model", messages=user("echo: a poison")
        )
    assert sync_error.value.status_code == 500

    def run() -> list[Any]:
        stream = client.chat.completions.create(
            model="fake-model", messages=user("echo: a poison"), stream=True
        )
        return list(stream)

    with pytest.raises(openai.APIError) as streamed:
        await in_thread(run)
    assert streamed.value.code == "server_error"
    await an_ordinary_request_completes(server)


async def test_a_reasoning_trace_is_reasoning_content(start_fake_server: StartServer) -> None:
    server = await start_fake_server(opens_reasoning=True)
    client = server.client()
    reply = "echo: plan it</think> the answer"
    completion = await in_thread(
        client.chat.completions.create, model="fake-model", messages=user(reply)
    )
    message = completion.choices[0].message
    assert message.content is not None
    assert message.content.strip() == "the answer"
    assert message.model_extra is not None
    assert message.model_extra["reasoning_content"] == "plan it"
    assert completion.usage is not None
    assert completion.usage.completion_tokens_details is not None
    assert completion.usage.completion_tokens_details.reasoning_tokens == 2

    def run() -> list[Any]:
        return list(
            client.chat.completions.create(model="fake-model", messages=user(reply), stream=True)
        )

    deltas = [c.choices[0].delta for c in await in_thread(run) if c.choices]
    traced = "".join((d.model_extra or {}).get("reasoning_content") or "" for d in deltas)
    assert traced == "plan it"
    assert "".join(d.content or "" for d in deltas).strip() == "the answer"
