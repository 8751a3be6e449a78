"""Conversations never lose their transcript, and deleted ones stay gone (fake engine)."""

from __future__ import annotations

import logging

import openai
import pytest

from mlxcel.config import StoreLimits

from support import StartServer, in_thread

SMALL = StoreLimits(16, 4_000, 3600)
"""A conversation store whose byte budget a few kilobytes of text fill."""


@pytest.fixture(params=["memory", "sqlite", "redis"])
def fake_store(request: pytest.FixtureRequest) -> str:
    """Every test here runs on every store backend."""
    return str(request.param)


async def test_items_past_the_budget_are_refused_and_the_conversation_is_kept(
    start_fake_server: StartServer,
) -> None:
    server = await start_fake_server(conversations=SMALL)
    client = server.client()
    conv = await in_thread(client.conversations.create, items=[{"role": "user", "content": "hi"}])
    with pytest.raises(openai.BadRequestError) as refused:
        await in_thread(
            client.conversations.items.create,
            conv.id,
            items=[{"role": "user", "content": "x" * 5_000}],
        )
    items = await in_thread(client.conversations.items.list, conv.id)
    assert [item.content[0].text for item in items.data] == ["hi"]  # type: ignore[union-attr]
    assert refused.value.code == "conversation_full"
    assert "is full" in refused.value.message
    resp = await in_thread(
        client.responses.create, model="fake-model", input="echo: still here", conversation=conv.id
    )
    assert resp.output_text == "still here"
    items = await in_thread(client.conversations.items.list, conv.id, order="asc")
    texts = [item.content[0].text for item in items.data]  # type: ignore[union-attr]
    assert texts == ["hi", "echo: still here", "still here"]


async def test_a_turn_that_overflows_the_conversation_keeps_its_history(
    start_fake_server: StartServer, caplog: pytest.LogCaptureFixture
) -> None:
    server = await start_fake_server(conversations=SMALL)
    client = server.client()
    conv = await in_thread(client.conversations.create, items=[{"role": "user", "content": "hi"}])
    caplog.set_level(logging.WARNING)
    long_echo = "echo: " + " ".join(["word"] * 500)
    resp = await in_thread(
        client.responses.create, model="fake-model", input=long_echo, conversation=conv.id
    )
    assert resp.status == "completed"  # the response itself is not at fault
    items = await in_thread(client.conversations.items.list, conv.id)
    assert [item.content[0].text for item in items.data] == ["hi"]  # type: ignore[union-attr]
    assert f"conversation {conv.id} is full" in caplog.text  # told to the operator


async def test_a_deleted_conversation_is_not_found_but_free_form_ids_start_one(
    start_fake_server: StartServer,
) -> None:
    server = await start_fake_server()
    client = server.client()
    conv = await in_thread(client.conversations.create, items=[{"role": "user", "content": "hi"}])
    await in_thread(client.conversations.delete, conv.id)
    with pytest.raises(openai.NotFoundError) as missing:
        await in_thread(
            client.responses.create, model="fake-model", input="echo: again", conversation=conv.id
        )
    assert conv.id in missing.value.message
    with pytest.raises(openai.NotFoundError):  # and it was not created again either
        await in_thread(client.conversations.retrieve, conv.id)
    for text in ("one", "two"):  # an id the client made up is still created on first use
        resp = await in_thread(
            client.responses.create,
            model="fake-model",
            input=f"echo: {text}",
            conversation="chat-7",
        )
        assert resp.output_text == text
    items = await in_thread(client.conversations.items.list, "chat-7", order="asc")
    texts = [item.content[0].text for item in items.data]  # type: ignore[union-attr]
    assert texts == ["echo: one", "one", "echo: two", "two"]
