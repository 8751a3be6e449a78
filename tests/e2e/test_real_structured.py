"""End to end on the real model: structured output through `responses.parse`."""

from __future__ import annotations

import json

import pytest
from pydantic import BaseModel

from server_process import RealServer

pytestmark = pytest.mark.e2e


class City(BaseModel):
    name: str
    country: str
    population_millions: float


def test_responses_parse_returns_a_parsed_object(real_server: RealServer) -> None:
    client = real_server.client()
    resp = client.responses.parse(
        model=real_server.alias,
        input="Give the capital of France as JSON with its country and population.",
        text_format=City,
        max_output_tokens=80,
        temperature=0,
    )
    assert resp.status == "completed"
    parsed = resp.output_parsed
    assert isinstance(parsed, City)
    assert parsed.name.strip()


def test_streamed_json_object_is_valid_json(real_server: RealServer) -> None:
    client = real_server.client()
    with client.responses.stream(
        model=real_server.alias,
        input="Describe a cat as a JSON object.",
        text={"format": {"type": "json_object"}},
        max_output_tokens=80,
        temperature=0,
    ) as stream:
        final = stream.get_final_response()
    if final.status == "completed":
        assert isinstance(json.loads(final.output_text), dict)
    else:  # stopped on length: still a JSON prefix, never text around it
        assert final.output_text.lstrip().startswith("{")


def test_messages_parse_returns_a_parsed_object(real_server: RealServer) -> None:
    from anthropic import Anthropic

    with Anthropic(base_url=real_server.url, api_key="sk-no-auth", max_retries=0) as client:
        message = client.messages.parse(
            model=real_server.alias,
            max_tokens=80,
            messages=[
                {
                    "role": "user",
                    "content": "Give the capital of France with its country and population.",
                }
            ],
            output_format=City,
            extra_body={"temperature": 0},
        )
    assert message.stop_reason == "end_turn"
    parsed = message.parsed_output
    assert isinstance(parsed, City)
    assert parsed.name.strip()
