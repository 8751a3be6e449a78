"""`/v1/messages` over real HTTP with the `anthropic` SDK (the fake engine scripts the
replies: `echo: TEXT` answers TEXT, one word per token)."""

from __future__ import annotations

from typing import Any

import anthropic
import httpx
import pytest

from support import FakeServer, StartServer, in_thread, post

WEATHER = {
    "name": "get_weather",
    "description": "The weather in a city.",
    "input_schema": {
        "type": "object",
        "properties": {"city": {"type": "string"}},
        "required": ["city"],
    },
}
CALL = '<tool_call>{"name": "get_weather", "arguments": {"city": "Paris"}}</tool_call>'


def user(text: str) -> list[dict[str, Any]]:
    return [{"role": "user", "content": text}]


def without_ids(message: Any) -> dict[str, Any]:
    """A message's JSON less its id and its calls' ids (new for every response)."""
    found: dict[str, Any] = message.model_dump(exclude={"id"})
    for block in found["content"]:
        if block["type"] == "tool_use":
            assert block.pop("id").startswith("call_")
    return found


async def test_a_message_answers_with_one_text_block(fake_server: FakeServer) -> None:
    client = fake_server.anthropic()
    message = await in_thread(
        client.messages.create,
        model="fake-model",
        max_tokens=64,
        system="Be brief.",
        messages=user("echo: hello there"),
    )
    assert message.type == "message"
    assert message.id.startswith("msg_")
    assert message.role == "assistant"
    assert message.model == "fake-model"
    [block] = message.content
    assert block.type == "text"
    assert block.text == "hello there"
    assert (message.stop_reason, message.stop_sequence) == ("end_turn", None)
    usage = message.usage
    assert usage.output_tokens == 2
    assert usage.cache_read_input_tokens == 0
    assert usage.input_tokens + (usage.cache_creation_input_tokens or 0) == len(
        fake_server.engine.last_prompt
    )
    assert message._request_id is not None
    assert message._request_id.startswith("req_")


async def test_the_streams_final_message_equals_the_message(fake_server: FakeServer) -> None:
    client = fake_server.anthropic()
    asked: dict[str, Any] = {
        "model": "fake-model",
        "max_tokens": 64,
        "messages": user(f"echo: Checking. {CALL}"),
        "tools": [WEATHER],
    }

    def stream() -> Any:
        with client.messages.stream(**asked) as events:
            return events.get_final_message()

    streamed = await in_thread(stream)
    created = await in_thread(client.messages.create, **asked)
    assert without_ids(streamed) == without_ids(created)
    assert [b.type for b in created.content] == ["text", "tool_use"]
    assert created.stop_reason == "tool_use"


async def test_a_forced_tool_use_and_its_result_complete_the_loop(
    fake_server: FakeServer,
) -> None:
    client = fake_server.anthropic()
    history: list[dict[str, Any]] = user(f"echo: {CALL}")
    called = await in_thread(
        client.messages.create,
        model="fake-model",
        max_tokens=64,
        messages=history,
        tools=[WEATHER],
        tool_choice={"type": "tool", "name": "get_weather"},
    )
    assert called.stop_reason == "tool_use"
    [use] = called.content
    assert use.type == "tool_use"
    assert use.name == "get_weather"
    assert use.input == {"city": "Paris"}
    assert use.id.startswith("call_")
    history += [
        {"role": "assistant", "content": [b.model_dump() for b in called.content]},
        {
            "role": "user",
            "content": [
                {"type": "tool_result", "tool_use_id": use.id, "content": "sunny"},
                {"type": "text", "text": "echo: It is sunny."},
            ],
        },
    ]
    done = await in_thread(
        client.messages.create, model="fake-model", max_tokens=64, messages=history, tools=[WEATHER]
    )
    assert done.stop_reason == "end_turn"
    assert [(b.type, getattr(b, "text", None)) for b in done.content] == [("text", "It is sunny.")]
    prompt = fake_server.engine.last_prompt
    assert '"city": "Paris"' in prompt  # the call, rendered in the assistant turn
    assert "\x01tool\x02sunny" in prompt  # and its output


async def test_any_tool_and_no_parallel_calls(fake_server: FakeServer) -> None:
    client = fake_server.anthropic()
    twice = f"echo: {CALL} {CALL}"
    for choice, calls in (
        ({"type": "any"}, 2),
        ({"type": "auto", "disable_parallel_tool_use": True}, 1),
    ):
        message = await in_thread(
            client.messages.create,
            model="fake-model",
            max_tokens=64,
            messages=user(twice),
            tools=[WEATHER],
            tool_choice=choice,
        )
        assert [b.type for b in message.content if b.type == "tool_use"] == ["tool_use"] * calls


async def test_tool_choice_none_offers_no_tools(fake_server: FakeServer) -> None:
    client = fake_server.anthropic()
    message = await in_thread(
        client.messages.create,
        model="fake-model",
        max_tokens=64,
        messages=user(f"echo: {CALL}"),
        tools=[WEATHER],
        tool_choice={"type": "none"},
    )
    assert [b.type for b in message.content] == ["text"]
    assert "get_weather" not in fake_server.engine.last_prompt.split("\x01user")[0]


async def test_max_tokens_and_stop_sequences_say_why_the_reply_stopped(
    fake_server: FakeServer,
) -> None:
    client = fake_server.anthropic()
    cut = await in_thread(
        client.messages.create, model="fake-model", max_tokens=2, messages=user("echo: a b c d")
    )
    assert (cut.stop_reason, cut.content[0].text) == ("max_tokens", "a b")  # type: ignore[union-attr]
    stopped = await in_thread(
        client.messages.create,
        model="fake-model",
        max_tokens=64,
        messages=user("echo: one two STOP three"),
        stop_sequences=["never", "STOP"],
    )
    assert stopped.stop_reason == "stop_sequence"
    assert stopped.stop_sequence == "STOP"
    assert stopped.content[0].text == "one two "  # type: ignore[union-attr]


async def test_count_tokens_equals_the_responses_count_of_the_same_conversation(
    fake_server: FakeServer,
) -> None:
    client = fake_server.anthropic()
    counted = await in_thread(
        client.messages.count_tokens,
        model="fake-model",
        system="Be brief.",
        messages=[
            {"role": "user", "content": "Weather in Paris?"},
            {
                "role": "assistant",
                "content": [
                    {"type": "text", "text": "Checking."},
                    {
                        "type": "tool_use",
                        "id": "c1",
                        "name": "get_weather",
                        "input": {"city": "Paris"},
                    },
                ],
            },
            {
                "role": "user",
                "content": [{"type": "tool_result", "tool_use_id": "c1", "content": "sunny"}],
            },
        ],
        tools=[WEATHER],
    )
    responses = await post(
        fake_server,
        "/v1/responses/input_tokens",
        {
            "model": "fake-model",
            "instructions": "Be brief.",
            "input": [
                {"role": "user", "content": "Weather in Paris?"},
                {"role": "assistant", "content": "Checking."},
                {
                    "type": "function_call",
                    "call_id": "c1",
                    "name": "get_weather",
                    "arguments": '{"city": "Paris"}',
                },
                {"type": "function_call_output", "call_id": "c1", "output": "sunny"},
            ],
            "tools": [
                {
                    "type": "function",
                    "name": "get_weather",
                    "description": WEATHER["description"],
                    "parameters": WEATHER["input_schema"],
                }
            ],
            "chat_template_kwargs": {"enable_thinking": False},
        },
    )
    assert responses.status_code == 200, responses.text
    assert counted.input_tokens == responses.json()["input_tokens"] > 0
    assert not fake_server.engine.prompts  # counted, never generated


async def test_a_bad_key_is_an_authentication_error(start_fake_server: StartServer) -> None:
    server = await start_fake_server(api_keys=("sk-right",))
    with pytest.raises(anthropic.AuthenticationError) as refused:
        await in_thread(
            server.anthropic("sk-wrong").messages.create,
            model="fake-model",
            max_tokens=8,
            messages=user("hi"),
        )
    assert refused.value.body["error"]["type"] == "authentication_error"  # type: ignore[index]
    assert refused.value.request_id is not None
    # The key as `x-api-key` (`api_key`) or as `Authorization: Bearer` (`auth_token`).
    for client in (server.anthropic("sk-right"), server.anthropic(None, auth_token="sk-right")):
        message = await in_thread(
            client.messages.create, model="fake-model", max_tokens=8, messages=user("echo: in")
        )
        assert message.content[0].text == "in"  # type: ignore[union-attr]


async def test_an_unknown_model_is_not_found(fake_server: FakeServer) -> None:
    with pytest.raises(anthropic.NotFoundError) as refused:
        await in_thread(
            fake_server.anthropic().messages.create,
            model="claude-nowhere",
            max_tokens=8,
            messages=user("hi"),
        )
    assert refused.value.body["error"]["type"] == "not_found_error"  # type: ignore[index]
    assert "claude-nowhere" in refused.value.body["error"]["message"]  # type: ignore[index]


async def test_a_spent_request_rate_is_a_rate_limit_error_with_retry_after(
    start_fake_server: StartServer,
) -> None:
    server = await start_fake_server(api_keys=("sk-a",), rate_limit_rpm=2)
    client = server.anthropic("sk-a")
    await in_thread(client.messages.count_tokens, model="fake-model", messages=user("hi"))
    await in_thread(client.messages.create, model="fake-model", max_tokens=8, messages=user("hi"))
    with pytest.raises(anthropic.RateLimitError) as refused:
        await in_thread(
            client.messages.create, model="fake-model", max_tokens=8, messages=user("hi")
        )
    assert refused.value.body["error"]["type"] == "rate_limit_error"  # type: ignore[index]
    assert 1 <= int(refused.value.response.headers["retry-after"]) <= 60


async def test_a_spent_daily_quota_is_a_rate_limit_error_until_midnight(
    start_fake_server: StartServer,
) -> None:
    server = await start_fake_server(api_keys=("sk-a",), daily_token_quota=20)
    client = server.anthropic("sk-a")
    # Counting charges no tokens; the message spends its prompt and reply.
    for _ in range(3):
        await in_thread(client.messages.count_tokens, model="fake-model", messages=user("hi"))
    await in_thread(
        client.messages.create, model="fake-model", max_tokens=8, messages=user("echo: a b")
    )
    with pytest.raises(anthropic.RateLimitError) as refused:
        await in_thread(
            client.messages.create, model="fake-model", max_tokens=8, messages=user("hi")
        )
    assert "daily token quota" in refused.value.body["error"]["message"]  # type: ignore[index]
    assert int(refused.value.response.headers["retry-after"]) <= 86_400


async def test_the_error_envelope_and_request_id_of_a_bad_request(
    fake_server: FakeServer,
) -> None:
    async with httpx.AsyncClient(base_url=fake_server.url, timeout=30) as http:
        r = await http.post(
            "/v1/messages?beta=true",
            json={"model": "fake-model", "messages": user("hi")},  # no max_tokens
            headers={"anthropic-version": "2023-06-01", "anthropic-beta": "whatever-2099"},
        )
    assert r.status_code == 400, r.text
    body = r.json()
    assert set(body) == {"type", "error", "request_id"}
    assert body["type"] == "error"
    assert body["error"]["type"] == "invalid_request_error"
    assert "max_tokens" in body["error"]["message"]
    assert body["request_id"] == r.headers["request-id"]


async def test_a_prompt_too_long_says_so_in_anthropics_words(
    start_fake_server: StartServer,
) -> None:
    server = await start_fake_server(context_length=64)
    with pytest.raises(anthropic.BadRequestError) as refused:
        await in_thread(
            server.anthropic().messages.create,
            model="fake-model",
            max_tokens=8,
            messages=user("x" * 100),
        )
    message = refused.value.body["error"]["message"]  # type: ignore[index]
    tokens, maximum = message.removeprefix("prompt is too long: ").split(" tokens > ")
    assert int(tokens) > 100
    assert maximum == "64 maximum"
