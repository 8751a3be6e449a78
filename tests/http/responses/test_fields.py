"""Request fields clients send that only shape the response object, or cap it:
`max_tool_calls`, `service_tier`, `safety_identifier`, `prompt_cache_key`,
`prompt_cache_retention`, `text.verbosity` and `include`, over real HTTP with the `openai`
SDK (the fake engine scripts the replies)."""

from __future__ import annotations

import json
from typing import Any

import httpx
import openai
import pytest

from mlxcel.http.objects import reasoning_content

from support import FakeServer, an_ordinary_request_completes, in_thread

WEATHER = {
    "type": "function",
    "name": "get_weather",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
}
CITIES = ["Paris", "Oslo", "Rome"]
THREE_CALLS = "echo: " + "".join(
    f'<tool_call>{{"name": "get_weather", "arguments": {{"city": "{city}"}}}}</tool_call>'
    for city in CITIES
)


async def test_the_fields_are_echoed_by_create_and_retrieve(fake_server: FakeServer) -> None:
    client = fake_server.client()
    resp = await in_thread(
        client.responses.create,
        model="fake-model",
        input="echo: fine",
        max_tool_calls=4,
        service_tier="flex",
        safety_identifier="user-hash-1",
        prompt_cache_key="tenant-cache-7",
        prompt_cache_retention="24h",
        text={"verbosity": "low"},
        truncation="disabled",
    )
    for shown in (resp, await in_thread(client.responses.retrieve, resp.id)):
        assert shown.output_text == "fine"
        assert shown.max_tool_calls == 4
        assert shown.service_tier == "default"  # the one tier this server runs
        assert shown.safety_identifier == "user-hash-1"
        assert shown.prompt_cache_key == "tenant-cache-7"
        assert shown.prompt_cache_retention == "24h"
        assert shown.text is not None
        assert shown.text.verbosity == "low"
        assert shown.truncation == "disabled"


async def test_unsent_fields_echo_their_defaults(fake_server: FakeServer) -> None:
    resp = await in_thread(
        fake_server.client().responses.create, model="fake-model", input="echo: x"
    )
    assert resp.max_tool_calls is None
    assert resp.prompt_cache_key is None
    assert resp.truncation == "disabled"
    assert resp.service_tier == "default"


@pytest.mark.parametrize(("cap", "made"), [(None, 3), (1, 1), (2, 2), (5, 3)])
async def test_max_tool_calls_drops_the_calls_beyond_it(
    fake_server: FakeServer, cap: int | None, made: int
) -> None:
    client = fake_server.client()
    extra: dict[str, Any] = {} if cap is None else {"max_tool_calls": cap}

    def stream() -> tuple[list[Any], Any]:
        with client.responses.stream(
            model="fake-model", input=THREE_CALLS, tools=[WEATHER], **extra
        ) as s:
            return list(s), s.get_final_response()

    events, final = await in_thread(stream)
    assert [json.loads(c.arguments)["city"] for c in final.output] == CITIES[:made]
    assert final.output_text == ""  # a dropped call leaks no markup
    added = [e for e in events if e.type == "response.output_item.added"]
    assert len(added) == made
    assert final.max_tool_calls == cap


async def test_include_logprobs_and_encrypted_reasoning(fake_server: FakeServer) -> None:
    client = fake_server.client()
    said = [{"role": "user", "content": "echo: <think>secret plan</think> answer"}]
    resp = await in_thread(
        client.responses.create,
        model="fake-model",
        input=said,
        store=False,
        include=["reasoning.encrypted_content", "message.output_text.logprobs"],
    )
    reasoning, message = resp.output
    assert reasoning.type == "reasoning"
    assert message.type == "message"
    assert reasoning.encrypted_content
    assert message.content[0].logprobs  # honoured: one entry per token
    # Stateless: the trace comes back only as `encrypted_content`, and renders as it was.
    sent_back = {"type": "reasoning", "id": reasoning.id, "summary": []}
    sent_back["encrypted_content"] = reasoning.encrypted_content
    turn = [*said, sent_back, {"role": "assistant", "content": "answer"}]
    turn.append({"role": "user", "content": "echo: next"})
    again = await in_thread(client.responses.create, model="fake-model", input=turn, store=False)
    assert again.output_text == "next"
    assert "\x01assistant\x02secret plananswer" in fake_server.engine.prompts[-1]
    # The trace read is the one sent (the echo cache would have put back "secret plan").
    sent_back["encrypted_content"] = reasoning_content("another plan")
    await in_thread(client.responses.create, model="fake-model", input=turn, store=False)
    assert "\x01assistant\x02another plananswer" in fake_server.engine.prompts[-1]


async def test_streamed_reasoning_items_carry_it_when_asked(fake_server: FakeServer) -> None:
    client = fake_server.client()
    said = "echo: <think>streamed plan</think> answer"

    def stream(include: list[Any]) -> tuple[list[Any], Any]:
        with client.responses.stream(model="fake-model", input=said, include=include) as s:
            return list(s), s.get_final_response()

    for include, shown in ((["reasoning.encrypted_content"], True), ([], False)):
        events, final = await in_thread(stream, include)
        done = [e.item for e in events if e.type == "response.output_item.done"]
        assert done[0].type == "reasoning"
        assert (done[0].encrypted_content is not None) is shown
        assert done[0].encrypted_content == final.output[0].encrypted_content


async def test_without_include_no_encrypted_content(fake_server: FakeServer) -> None:
    said = "echo: <think>secret plan</think> answer"
    resp = await in_thread(fake_server.client().responses.create, model="fake-model", input=said)
    assert resp.output[0].type == "reasoning"
    assert resp.output[0].encrypted_content is None


async def test_hostile_encrypted_content_and_include(fake_server: FakeServer) -> None:
    """Another server's blob and garbage are ignored (no trace), never a 500; an unknown
    `include` value is a 400 naming the field."""
    async with httpx.AsyncClient(timeout=30) as http:
        for blob in ("gAAAAABopaque==", "mlx-reasoning.%%%%", "mlx-reasoning." + "A" * 100_001):
            body = {
                "model": "fake-model",
                "input": [
                    {"type": "reasoning", "summary": [], "encrypted_content": blob},
                    {"role": "user", "content": "echo: ok"},
                ],
            }
            r = await http.post(f"{fake_server.url}/v1/responses", json=body)
            assert r.status_code == 200, r.text
        r = await http.post(
            f"{fake_server.url}/v1/responses",
            json={"model": "fake-model", "input": "x", "include": ["file_search_call.results", 3]},
        )
        assert r.status_code == 400
        assert r.json()["error"]["param"].startswith("include")
    with pytest.raises(openai.BadRequestError):
        await in_thread(
            fake_server.client().responses.create,
            model="fake-model",
            input="x",
            service_tier="platinum",  # type: ignore[arg-type]
        )
    await an_ordinary_request_completes(fake_server)
