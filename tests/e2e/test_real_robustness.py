"""End to end on the real model: a reply shaped to break the tool-call parser, and
log-probabilities of tokens a grammar masks."""

from __future__ import annotations

import json

import httpx
import pytest

from mlxcel.http.objects import LOGPROB_FLOOR

from server_process import RealServer

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


# Two keys of fixed shape: most tokens are masked at every step.
CITY = {
    "type": "json_schema",
    "name": "city",
    "schema": {
        "type": "object",
        "properties": {"city": {"type": "string", "maxLength": 12}},
        "required": ["city"],
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


@pytest.mark.parametrize("stream", [False, True])
def test_log_probabilities_under_a_grammar_are_strict_json(
    real_server: RealServer, stream: bool
) -> None:
    """A grammar masks most of the vocabulary to -inf; the alternatives it reports must
    still be numbers every strict JSON parser reads."""

    def refuse(name: str) -> object:
        raise AssertionError(f"the server sent {name}, which is not JSON")

    body = {
        "model": real_server.alias,
        "input": "Give a city as JSON.",
        "text": {"format": CITY},
        "max_output_tokens": 24,
        "temperature": 0,
        "top_logprobs": 20,
        "include": ["message.output_text.logprobs"],
        "stream": stream,
    }
    r = httpx.post(f"{real_server.url}/v1/responses", json=body, timeout=300)
    assert r.status_code == 200, r.text
    if stream:
        events = [line[6:] for line in r.text.splitlines() if line.startswith("data: ")]
        done = [json.loads(e, parse_constant=refuse) for e in events][-1]["response"]
    else:
        done = json.loads(r.text, parse_constant=refuse)
    part = done["output"][0]["content"][0]
    values = [alt["logprob"] for entry in part["logprobs"] for alt in entry["top_logprobs"]]
    assert len(values) == 20 * len(part["logprobs"])
    assert min(values) == LOGPROB_FLOOR  # masked alternatives are reported at the floor
