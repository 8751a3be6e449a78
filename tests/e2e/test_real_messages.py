"""End to end on the real model: Anthropic's Messages API with the `anthropic` SDK, and
Claude Code's billing line, whose nonce would otherwise defeat the prompt cache."""

from __future__ import annotations

import secrets
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from anthropic import Anthropic

from server_process import RealServer

pytestmark = pytest.mark.e2e

WEATHER = {
    "name": "get_weather",
    "description": "Get the current weather for a city.",
    "input_schema": {
        "type": "object",
        "properties": {"city": {"type": "string"}},
        "required": ["city"],
        "additionalProperties": False,
    },
}
GREEDY = {"temperature": 0}
"""Sent as an extra field: the SDK no longer offers sampling settings (the API takes them)."""
SYSTEM = " ".join(
    f"Rule {n}: answer in plain words, keep it short, and never mention rule {n}."
    for n in range(1, 25)
)
"""A system prompt of a few hundred tokens, as a coding agent's would start."""


@pytest.fixture
def client(real_server: RealServer) -> Iterator[Anthropic]:
    with Anthropic(base_url=real_server.url, api_key="sk-no-auth", max_retries=0) as made:
        yield made


def billing_line() -> str:
    """Claude Code's first line of `system`, with a nonce new every request."""
    return f"x-anthropic-billing-header: cc_version=2.1.37.a1b; cch={secrets.token_hex(4)};"


def prompt_share_cached(usage: Any) -> float:
    total = usage.input_tokens + usage.cache_read_input_tokens + usage.cache_creation_input_tokens
    return float(usage.cache_read_input_tokens / total)


def test_a_message_and_its_stream(real_server: RealServer, client: Anthropic) -> None:
    asked: dict[str, Any] = {
        "model": real_server.alias,
        "max_tokens": 8,
        "extra_body": GREEDY,
        "messages": [{"role": "user", "content": "What is the capital of France? One word."}],
    }
    message = client.messages.create(**asked)
    [block] = message.content
    assert block.type == "text"
    assert "paris" in block.text.lower()
    with client.messages.stream(**asked) as stream:
        streamed = stream.get_final_message()
    assert streamed.content[0].text == block.text  # type: ignore[union-attr]
    assert streamed.stop_reason == message.stop_reason


def test_a_forced_tool_use_and_its_result(real_server: RealServer, client: Anthropic) -> None:
    question = {"role": "user", "content": "What is the weather in Paris?"}
    called = client.messages.create(
        model=real_server.alias,
        max_tokens=48,
        extra_body=GREEDY,
        messages=[question],  # type: ignore[list-item]
        tools=[WEATHER],  # type: ignore[list-item]
        tool_choice={"type": "tool", "name": "get_weather"},
    )
    assert called.stop_reason == "tool_use"
    [use] = [b for b in called.content if b.type == "tool_use"]
    assert isinstance(use.input, dict)
    assert "paris" in str(use.input["city"]).lower()
    done = client.messages.create(
        model=real_server.alias,
        max_tokens=24,
        extra_body=GREEDY,
        messages=[
            question,  # type: ignore[list-item]
            {"role": "assistant", "content": called.content},
            {
                "role": "user",
                "content": [
                    {"type": "tool_result", "tool_use_id": use.id, "content": "Sunny, 24 C"}
                ],
            },
        ],
        tools=[WEATHER],  # type: ignore[list-item]
    )
    assert done.stop_reason in ("end_turn", "max_tokens")
    assert any(b.type == "text" and b.text.strip() for b in done.content)


def test_the_billing_nonce_does_not_defeat_the_prompt_cache(
    real_server: RealServer, client: Anthropic
) -> None:
    def turn(system: str) -> Any:
        return client.messages.create(
            model=real_server.alias,
            max_tokens=4,
            extra_body=GREEDY,
            system=system,
            messages=[{"role": "user", "content": "Say hi."}],
        ).usage

    first = turn(f"{billing_line()}\n{SYSTEM}")
    second = turn(f"{billing_line()}\n{SYSTEM}")  # a new nonce, as every request has
    assert first.input_tokens + first.cache_creation_input_tokens > 200
    assert prompt_share_cached(second) >= 0.95
    # The control: the same line not first is the client's own text and stays, so the
    # prompts part at its nonce, early on.
    control = turn(f"Hello.\n{billing_line()}\n{SYSTEM}")
    again = turn(f"Hello.\n{billing_line()}\n{SYSTEM}")
    assert prompt_share_cached(control) < 0.5
    assert prompt_share_cached(again) < 0.5


def split(usage: Any) -> tuple[int, int, int]:
    return (usage.input_tokens, usage.cache_read_input_tokens, usage.cache_creation_input_tokens)


def test_usage_splits_the_prompt_as_anthropic_does(
    real_server: RealServer, client: Anthropic
) -> None:
    system = f"Case {secrets.token_hex(8)}. {SYSTEM}"  # a prefix no cache entry holds yet
    asked: dict[str, Any] = {
        "model": real_server.alias,
        "system": system,
        "messages": [{"role": "user", "content": "Say hi."}],
    }
    counted = client.messages.count_tokens(**asked).input_tokens
    asked |= {"max_tokens": 4, "extra_body": GREEDY}
    cold = client.messages.create(**asked).usage
    assert cold.cache_creation_input_tokens == 0  # no `cache_control`: nothing written
    assert cold.cache_read_input_tokens < counted // 2  # the template's opening at most
    assert cold.input_tokens + cold.cache_read_input_tokens == counted
    warm = client.messages.create(**asked).usage
    assert warm.cache_read_input_tokens > counted // 2
    assert warm.cache_creation_input_tokens == 0
    assert warm.input_tokens + warm.cache_read_input_tokens == counted
    with client.messages.stream(**asked) as stream:
        events = list(stream)
        final = stream.get_final_message()
    [start] = [e.message.usage for e in events if e.type == "message_start"]
    [delta] = [e.usage for e in events if e.type == "message_delta"]
    assert split(start) == split(delta) == split(warm)
    assert final.usage.model_dump() == warm.model_dump()
    marked = [{"type": "text", "text": f"Case {secrets.token_hex(8)}. {SYSTEM}"}]
    marked[0]["cache_control"] = {"type": "ephemeral"}  # type: ignore[assignment]
    counted = client.messages.count_tokens(
        model=real_server.alias, system=marked, messages=asked["messages"]
    ).input_tokens
    written = client.messages.create(**(asked | {"system": marked})).usage
    assert written.cache_read_input_tokens < counted // 2
    assert written.cache_creation_input_tokens > counted // 2
    assert sum(split(written)) == counted
    assert httpx.get(f"{real_server.url}/health", timeout=30).status_code == 200
