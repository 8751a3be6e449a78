"""`item_reference` in `POST /v1/conversations/{id}/items`, over real HTTP with the `openai`
SDK on every store backend: a stored response's item joins the conversation under its own
id; unknown, another tenant's and repeated ids are 400s that change nothing."""

from __future__ import annotations

import httpx
import openai
import pytest

from support import StartServer, in_thread

KEYS = ("key-a", "key-b")


@pytest.fixture(params=["memory", "sqlite", "redis"])
def fake_store(request: pytest.FixtureRequest) -> str:
    return str(request.param)


async def test_a_referenced_item_joins_the_conversation(start_fake_server: StartServer) -> None:
    server = await start_fake_server(api_keys=KEYS)
    client = server.client(KEYS[0])
    first = await in_thread(client.responses.create, model="fake-model", input="echo: blue sky")
    answer = first.output[0]
    asked = (await in_thread(client.responses.input_items.list, first.id)).data[0]
    conversation = await in_thread(client.conversations.create)
    added = await in_thread(
        client.conversations.items.create,
        conversation.id,
        items=[
            {"type": "item_reference", "id": asked.id},
            {"type": "item_reference", "id": answer.id},
            {"role": "user", "content": "echo: and now?"},
        ],
    )
    assert [i.id for i in added.data][:2] == [asked.id, answer.id]
    assert added.data[1].type == "message"
    listed = await in_thread(client.conversations.items.list, conversation.id, order="asc")
    assert [i.id for i in listed.data][:2] == [asked.id, answer.id]
    got = await in_thread(
        client.conversations.items.retrieve, answer.id, conversation_id=conversation.id
    )
    assert got.content[0].text == "blue sky"
    # The model reads them as turns of the conversation.
    resp = await in_thread(
        client.responses.create, model="fake-model", input="echo: go", conversation=conversation.id
    )
    assert resp.output_text == "go"
    assert (
        "\x01user\x02echo: blue sky\x01assistant\x02blue sky\x01user\x02echo: and now?"
        in (server.engine.prompts[-1])
    )


async def test_bad_references_are_400_and_change_nothing(start_fake_server: StartServer) -> None:
    server = await start_fake_server(api_keys=KEYS)
    a, b = server.client(KEYS[0]), server.client(KEYS[1])
    theirs = await in_thread(b.responses.create, model="fake-model", input="echo: private")
    mine = await in_thread(a.responses.create, model="fake-model", input="echo: mine")
    conversation = await in_thread(a.conversations.create)
    cases = [
        ([{"type": "item_reference", "id": "msg_nope"}], "items[0].id"),
        ([{"role": "user", "content": "x"}, {"id": theirs.output[0].id}], "items[1].id"),
        (
            [{"id": mine.output[0].id}, {"type": "item_reference", "id": mine.output[0].id}],
            "items[1].id",
        ),
        ([{"type": "item_reference", "id": ""}], "items[0]"),
    ]
    for items, param in cases:
        with pytest.raises(openai.BadRequestError) as refused:
            await in_thread(a.conversations.items.create, conversation.id, items=items)
        assert refused.value.param is not None
        assert refused.value.param.startswith(param), refused.value.param
    listed = await in_thread(a.conversations.items.list, conversation.id)
    assert listed.data == []
    # Once added, the same item cannot be added again.
    ref = {"type": "item_reference", "id": mine.output[0].id}
    await in_thread(a.conversations.items.create, conversation.id, items=[ref])
    with pytest.raises(openai.BadRequestError):
        await in_thread(a.conversations.items.create, conversation.id, items=[ref])
    # Another tenant cannot add to this conversation at all.
    with pytest.raises(openai.NotFoundError):
        await in_thread(b.conversations.items.create, conversation.id, items=[ref])
    async with httpx.AsyncClient(timeout=10) as http:
        assert (await http.get(f"{server.url}/health")).status_code == 200
    resp = await in_thread(a.responses.create, model="fake-model", input="echo: still fine")
    assert resp.output_text == "still fine"


async def test_a_conversation_is_created_with_references(start_fake_server: StartServer) -> None:
    server = await start_fake_server()
    client = server.client()
    first = await in_thread(client.responses.create, model="fake-model", input="echo: seed")
    ref = {"type": "item_reference", "id": first.output[0].id}
    conversation = await in_thread(client.conversations.create, items=[ref])
    listed = await in_thread(client.conversations.items.list, conversation.id)
    assert [i.id for i in listed.data] == [first.output[0].id]
    for items in ([{"type": "item_reference", "id": "msg_missing"}], [ref, ref]):
        with pytest.raises(openai.BadRequestError) as refused:
            await in_thread(client.conversations.create, items=items)
        assert refused.value.param is not None
        assert refused.value.param.startswith("items[")
