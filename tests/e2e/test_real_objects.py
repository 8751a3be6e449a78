"""End to end on the real model: the response object carries every field the API's schemas
require (create, retrieve, each stream event that embeds it), the Responses API honours
and echoes the penalties, and a short history compacts to itself."""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from object_fields import check_compaction, checked_response
from server_process import RealServer
from sse_frames import frames

pytestmark = pytest.mark.e2e

WEATHER = {
    "type": "function",
    "name": "get_weather",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
}
REPEAT = "Repeat after me: cat cat cat cat cat cat cat cat cat cat"


def test_create_retrieve_and_stream_carry_every_field(real_server: RealServer) -> None:
    client = real_server.client()
    body: dict[str, Any] = {
        "model": real_server.alias,
        "input": "Reply with one word: hello",
        "max_output_tokens": 8,
        "temperature": 0,
        "tools": [WEATHER],
    }
    created = client.responses.with_raw_response.create(**body).http_response.json()
    retrieved = client.responses.with_raw_response.retrieve(created["id"]).http_response.json()
    for shown in (created, retrieved):
        checked_response(shown)
        assert shown["background"] is False
        assert shown["tools"][0]["strict"] is True
    with httpx.Client(base_url=real_server.url, timeout=120) as http:
        r = http.post("/v1/responses", json={**body, "stream": True})
    assert r.status_code == 200, r.text
    embedding = [(name, data) for name, data in frames(r.content) if "response" in data]
    assert [name for name, _ in embedding][:2] == ["response.created", "response.in_progress"]
    assert embedding[-1][0] in ("response.completed", "response.incomplete")
    for _, data in embedding:
        checked_response(data["response"])


def test_a_frequency_penalty_changes_a_greedy_response(real_server: RealServer) -> None:
    client = real_server.client()

    def ask(**extra: Any) -> dict[str, Any]:
        answer = client.responses.with_raw_response.create(
            model=real_server.alias,
            input=REPEAT,
            max_output_tokens=40,
            temperature=0,
            extra_body=extra,
        )
        body: dict[str, Any] = answer.http_response.json()
        return body

    plain, penalised = ask(), ask(frequency_penalty=2.0)
    text = [p["output"][-1]["content"][0]["text"] for p in (plain, penalised)]
    assert text[0].lower().count("cat") >= 6, text[0]
    assert text[1].lower().count("cat") < text[0].lower().count("cat"), text[1]
    assert (plain["frequency_penalty"], penalised["frequency_penalty"]) == (0, 2.0)


@pytest.mark.parametrize(
    "sent",
    [
        [{"role": "user", "content": "How are you?"}],
        [
            {"role": "user", "content": "hi"},
            {"role": "assistant", "content": "Hello!"},
            {"role": "user", "content": "How are you?"},
        ],
    ],
)
def test_a_short_history_compacts_to_itself(
    real_server: RealServer, sent: list[dict[str, str]]
) -> None:
    client = real_server.client()
    answer = client.responses.with_raw_response.compact(
        model=real_server.alias, input=sent, extra_body={"max_output_tokens": 64}
    )
    body = answer.http_response.json()
    check_compaction(body)
    shown = [
        (i["type"], i.get("role"), i.get("content", [{}])[0].get("text")) for i in body["output"]
    ]
    assert shown == [("message", m["role"], m["content"]) for m in sent]
    reply = client.responses.create(
        model=real_server.alias, input=[*body["output"]], max_output_tokens=8, temperature=0
    )
    assert reply.status in ("completed", "incomplete")
