"""End to end on the real model: a reply shaped to break the tool-call parser."""

from __future__ import annotations

import httpx
import pytest

from support import RealServer

pytestmark = pytest.mark.e2e

WEATHER = {
    "type": "function",
    "name": "get_weather",
    "description": "The weather in a city.",
    "parameters": {
        "type": "object",
        "properties": {"city": {"type": "string"}},
        "required": ["city"],
    },
}

# A reply held to this schema is a bare JSON "call" whose name is an array.
ARRAY_NAME = {
    "type": "json_schema",
    "name": "call",
    "schema": {
        "type": "object",
        "properties": {
            "name": {"type": "array", "items": {"type": "string"}, "maxItems": 2},
            "arguments": {"type": "object", "properties": {}, "additionalProperties": False},
        },
        "required": ["name", "arguments"],
        "additionalProperties": False,
    },
    "strict": True,
}


@pytest.mark.parametrize("stream", [False, True])
def test_a_call_with_an_array_name_fails_nothing(real_server: RealServer, stream: bool) -> None:
    client = real_server.client()
    kwargs = {
        "model": real_server.alias,
        "input": "Call get_weather for Paris.",
        "tools": [WEATHER],
        "text": {"format": ARRAY_NAME},
        "max_output_tokens": 40,
        "temperature": 0,
    }
    if stream:
        with client.responses.stream(**kwargs) as events:
            resp = events.get_final_response()
    else:
        resp = client.responses.create(**kwargs)
    assert resp.status in ("completed", "incomplete")
    assert not [item for item in resp.output if item.type == "function_call"]
    assert '"name"' in resp.output_text
    # The server goes on: health answers and an ordinary request completes.
    assert httpx.get(f"{real_server.url}/health", timeout=10).json()["status"] == "ok"
    after = client.responses.create(
        model=real_server.alias, input="Reply with: ok", max_output_tokens=8, temperature=0
    )
    assert after.status in ("completed", "incomplete")
