"""The Conversations API with the `openai` SDK and the Agents SDK (fake engine)."""

from __future__ import annotations

import asyncio
from typing import Any

import httpx
import openai
import pytest

from support import FakeServer, in_thread


@pytest.fixture(params=["memory", "sqlite", "redis"])
def fake_store(request: pytest.FixtureRequest) -> str:
    """Every test here runs on every store backend."""
    return str(request.param)


async def test_conversation_lifecycle_with_the_sdk(fake_server: FakeServer) -> None:
    client = fake_server.client()
    conv = await in_thread(
        client.conversations.create,
        items=[{"role": "user", "content": "echo: first"}],
        metadata={"topic": "demo"},
    )
    assert conv.id.startswith("conv_")
    assert conv.metadata == {"topic": "demo"}
    got = await in_thread(client.conversations.retrieve, conv.id)
    assert got.model_dump() == conv.model_dump()
    updated = await in_thread(client.conversations.update, conv.id, metadata={"topic": "new"})
    assert updated.metadata == {"topic": "new"}

    resp = await in_thread(
        client.responses.create, model="fake-model", input="echo: second", conversation=conv.id
    )
    assert resp.output_text == "second"
    items = await in_thread(client.conversations.items.list, conv.id, order="asc")
    texts = [item.content[0].text for item in items.data]  # type: ignore[union-attr]
    assert texts == ["echo: first", "echo: second", "second"]

    added = await in_thread(
        client.conversations.items.create,
        conv.id,
        items=[{"role": "user", "content": "echo: third"}],
    )
    new_id = added.data[0].id
    item = await in_thread(client.conversations.items.retrieve, new_id, conversation_id=conv.id)
    assert item.id == new_id
    await in_thread(client.conversations.items.delete, new_id, conversation_id=conv.id)
    items = await in_thread(client.conversations.items.list, conv.id)
    assert len(items.data) == 3
    deleted = await in_thread(client.conversations.delete, conv.id)
    assert deleted.deleted
    with pytest.raises(openai.NotFoundError):
        await in_thread(client.conversations.retrieve, conv.id)


async def test_conversation_errors(fake_server: FakeServer) -> None:
    async with httpx.AsyncClient(base_url=fake_server.url, timeout=30) as http:
        assert (await http.get("/v1/conversations/conv_missing")).status_code == 404
        r = await http.post("/v1/conversations", json={"items": "nope"})
        assert r.status_code == 400
        r = await http.post("/v1/conversations", json={"metadata": {"k": "v" * 600}})
        assert r.status_code == 400
        conv = (await http.post("/v1/conversations", json={})).json()
        r = await http.post(f"/v1/conversations/{conv['id']}/items", json={"items": []})
        assert r.status_code == 400
        r = await http.delete(f"/v1/conversations/{conv['id']}/items/msg_missing")
        assert r.status_code == 404


async def test_agents_sdk_conversations_session_round_trip(fake_server: FakeServer) -> None:
    from agents import Agent, Runner, set_tracing_disabled
    from agents.memory import OpenAIConversationsSession
    from agents.models.openai_responses import OpenAIResponsesModel

    set_tracing_disabled(True)

    async def scenario() -> dict[str, Any]:
        client = openai.AsyncOpenAI(base_url=f"{fake_server.url}/v1", api_key="sk-no-auth")
        session = OpenAIConversationsSession(openai_client=client)
        agent = Agent(
            name="echo",
            instructions="Repeat after the user.",
            model=OpenAIResponsesModel(model="fake-model", openai_client=client),
        )
        first = await Runner.run(agent, "echo: one", session=session)
        second = await Runner.run(agent, "echo: two", session=session)
        history = await session.get_items()
        popped = await session.pop_item()
        after_pop = await session.get_items()
        await session.clear_session()
        await client.close()
        return {
            "first": first.final_output,
            "second": second.final_output,
            "history": history,
            "popped": popped,
            "after_pop": after_pop,
        }

    result = await in_thread(asyncio.run, scenario())
    assert (result["first"], result["second"]) == ("one", "two")
    roles = [item.get("role") for item in result["history"]]
    assert roles == ["user", "assistant", "user", "assistant"]
    assert result["popped"]["role"] == "assistant"
    assert len(result["after_pop"]) == 3
