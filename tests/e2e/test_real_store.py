"""End to end on the real model: stored responses, chains, conversations, token counts."""

from __future__ import annotations

import httpx
import openai
import pytest

from server_process import RealServer

pytestmark = pytest.mark.e2e


def test_retrieve_delete_and_store_false(real_server: RealServer) -> None:
    client = real_server.client()
    created = client.responses.create(
        model=real_server.alias, input="Say yes.", max_output_tokens=8, temperature=0
    )
    assert client.responses.retrieve(created.id).model_dump() == created.model_dump()
    client.responses.delete(created.id)
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(created.id)
    ephemeral = client.responses.create(
        model=real_server.alias, input="Say no.", max_output_tokens=8, store=False
    )
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(ephemeral.id)


def test_three_hop_chain_counts_like_the_full_history(real_server: RealServer) -> None:
    client = real_server.client()
    alias = real_server.alias
    a = client.responses.create(
        model=alias,
        input="My name is Ada.",
        max_output_tokens=16,
        temperature=0,
        instructions="You are terse.",
    )
    b = client.responses.create(
        model=alias,
        input="I live in Paris.",
        max_output_tokens=16,
        temperature=0,
        previous_response_id=a.id,
    )
    hop3 = client.responses.input_tokens.count(
        model=alias, input="What is my name?", previous_response_id=b.id
    )
    explicit = client.responses.input_tokens.count(
        model=alias,
        input=[
            {"role": "user", "content": "My name is Ada."},
            *[item.model_dump() for item in a.output],
            {"role": "user", "content": "I live in Paris."},
            *[item.model_dump() for item in b.output],
            {"role": "user", "content": "What is my name?"},
        ],
    )
    assert hop3.input_tokens == explicit.input_tokens
    c = client.responses.create(
        model=alias,
        input="What is my name?",
        max_output_tokens=16,
        temperature=0,
        previous_response_id=b.id,
    )
    assert c.usage is not None
    assert c.usage.input_tokens == hop3.input_tokens
    assert c.instructions is None
    assert "ada" in c.output_text.lower()


def test_conversation_across_two_turns(real_server: RealServer) -> None:
    client = real_server.client()
    conv = client.conversations.create()
    client.responses.create(
        model=real_server.alias,
        input="Remember the number 42.",
        max_output_tokens=16,
        temperature=0,
        conversation=conv.id,
    )
    second = client.responses.create(
        model=real_server.alias,
        input="Which number did I ask you to remember?",
        max_output_tokens=16,
        temperature=0,
        conversation=conv.id,
    )
    assert "42" in second.output_text
    items = client.conversations.items.list(conv.id, order="asc")
    assert len(items.data) == 4


def test_malformed_requests_leave_the_store_intact(real_server: RealServer) -> None:
    client = real_server.client()
    kept = client.responses.create(model=real_server.alias, input="Say ok.", max_output_tokens=4)
    with httpx.Client(base_url=real_server.url, timeout=120) as http:
        bad = http.post("/v1/responses", json={"model": real_server.alias, "input": [{"x": 1}]})
        assert bad.status_code == 400
        assert http.get("/v1/responses/not-an-id").status_code == 400
    assert client.responses.retrieve(kept.id).model_dump() == kept.model_dump()
