"""Structured outputs on `/v1/messages` over real HTTP with the `anthropic` SDK: the
schema of `output_config.format` (what `messages.parse` sends) becomes the grammar the
reply is sampled under, as chat's `response_format` does; a schema that cannot be
enforced is a 400. (The fake engine follows its script, not the grammar: the real model's
test is `tests/e2e/test_real_structured.py`.)"""

from __future__ import annotations

import json
from typing import Any

import httpx
from pydantic import BaseModel

from support import FakeServer, in_thread, post

CITY_SCHEMA = {
    "type": "object",
    "properties": {"name": {"type": "string"}},
    "required": ["name"],
    "additionalProperties": False,
}


class City(BaseModel):
    name: str


def body(text: str, **extra: Any) -> dict[str, Any]:
    return {
        "model": "fake-model",
        "max_tokens": 32,
        "messages": [{"role": "user", "content": text}],
        **extra,
    }


async def test_messages_parse_samples_under_the_schema(fake_server: FakeServer) -> None:
    client = fake_server.anthropic()
    message = await in_thread(
        client.messages.parse,
        model="fake-model",
        max_tokens=32,
        messages=[{"role": "user", "content": 'echo: {"name": "Paris"}'}],
        output_format=City,
    )
    assert message.parsed_output == City(name="Paris")
    grammar = fake_server.engine.samplings[-1].grammar
    assert grammar is not None
    assert '"name"' in grammar


async def test_both_spellings_carry_the_schema_and_plain_text_has_none(
    fake_server: FakeServer,
) -> None:
    fmt = {"type": "json_schema", "schema": CITY_SCHEMA}
    for extra in ({"output_config": {"format": fmt, "effort": "low"}}, {"output_format": fmt}):
        r = await post(fake_server, "/v1/messages", body('echo: {"name": "Rome"}', **extra))
        assert r.status_code == 200, r.text
        assert json.loads(r.json()["content"][0]["text"]) == {"name": "Rome"}
        assert fake_server.engine.samplings[-1].grammar is not None
    r = await post(fake_server, "/v1/messages", body("echo: plain"))
    assert r.status_code == 200
    assert fake_server.engine.samplings[-1].grammar is None


async def test_a_schema_that_cannot_be_enforced_is_a_400(fake_server: FakeServer) -> None:
    bad = {"type": "object", "properties": {"n": {"type": "nonsense"}}}
    cases = [
        ({"output_config": {"format": {"type": "json_schema", "schema": bad}}}, "output_config"),
        ({"output_format": {"type": "json_schema", "schema": bad}}, "output_format"),
        ({"output_config": {"format": {"type": "regex", "schema": {}}}}, "output_config"),
        ({"output_config": {"format": {"type": "json_schema"}}}, "output_config"),
    ]
    for extra, named in cases:
        r = await post(fake_server, "/v1/messages", body("echo: hi", **extra))
        assert r.status_code == 400, r.text
        error = r.json()["error"]
        assert error["type"] == "invalid_request_error"
        assert named in error["message"], error
    async with httpx.AsyncClient(base_url=fake_server.url, timeout=30) as http:
        assert (await http.get("/health")).status_code == 200
    r = await post(fake_server, "/v1/messages", body("echo: still here"))
    assert r.json()["content"][0]["text"] == "still here"
