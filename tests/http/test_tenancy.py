"""API keys as tenants, over real HTTP with the `openai` SDK (fake engine): what one key's
requests store is not found by another key's, on every store backend."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import httpx
import openai
import pytest
import trio
from openai import OpenAI
from openai.types.responses import Response

from mlxcel.model.fake import FakeEngine

from support import LONG, FakeServer, StartServer, in_thread, wait_until

KEYS = ("key-a", "key-b")
TERMINAL = ("completed", "incomplete", "failed", "cancelled")
Call = tuple[Callable[..., Any], tuple[Any, ...], dict[str, Any]]


@pytest.fixture(params=["memory", "sqlite", "redis"])
def fake_store(request: pytest.FixtureRequest) -> str:
    """Every test here runs on every store backend."""
    return str(request.param)


async def two_tenants(
    start_fake_server: StartServer, engine: FakeEngine | None = None, **settings: Any
) -> tuple[FakeServer, OpenAI, OpenAI]:
    server = await start_fake_server(engine, api_keys=KEYS, **settings)
    return server, server.client(KEYS[0]), server.client(KEYS[1])


async def not_found(call: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """The 404 body the call earns."""
    with pytest.raises(openai.NotFoundError) as caught:
        await in_thread(call, *args, **kwargs)
    return caught.value.response.json()


def response_routes(client: OpenAI, response_id: str) -> list[Call]:
    return [
        (client.responses.retrieve, (response_id,), {}),
        (client.responses.input_items.list, (response_id,), {}),
        (client.responses.cancel, (response_id,), {}),
        (client.responses.delete, (response_id,), {}),
    ]


def conversation_routes(client: OpenAI, conversation_id: str, item_id: str) -> list[Call]:
    intruder = [{"type": "message", "role": "user", "content": "intruder"}]
    return [
        (client.conversations.retrieve, (conversation_id,), {}),
        (client.conversations.update, (conversation_id,), {"metadata": {"k": "stolen"}}),
        (client.conversations.items.list, (conversation_id,), {}),
        (client.conversations.items.create, (conversation_id,), {"items": intruder}),
        (client.conversations.items.retrieve, (item_id,), {"conversation_id": conversation_id}),
        (client.conversations.items.delete, (item_id,), {"conversation_id": conversation_id}),
        (
            client.responses.create,
            (),
            {"model": "fake-model", "input": "echo: x", "conversation": conversation_id},
        ),
        (client.conversations.delete, (conversation_id,), {}),
    ]


async def poll(client: OpenAI, response_id: str) -> Response:
    with trio.fail_after(20):
        while True:
            resp: Response = await in_thread(client.responses.retrieve, response_id)
            if resp.status in TERMINAL:
                return resp
            await trio.sleep(0.02)


async def test_another_tenants_response_is_not_found_on_every_route(
    start_fake_server: StartServer,
) -> None:
    server, a, b = await two_tenants(start_fake_server)
    kept = await in_thread(a.responses.create, model="fake-model", input="echo: mine")
    refused = [await not_found(f, *args, **kw) for f, args, kw in response_routes(b, kept.id)]
    # Nothing of it changed, for its tenant; the same key on another client is that tenant.
    assert (await in_thread(a.responses.retrieve, kept.id)).output_text == "mine"
    listed = await in_thread(a.responses.input_items.list, kept.id)
    assert len(listed.data) == 1
    again = server.client(KEYS[0])
    assert (await in_thread(again.responses.retrieve, kept.id)).id == kept.id
    # Another tenant's id answers exactly as a missing one.
    await in_thread(a.responses.delete, kept.id)
    missing = [await not_found(f, *args, **kw) for f, args, kw in response_routes(a, kept.id)]
    assert refused == missing
    assert refused[0]["error"]["code"] == "not_found"


async def test_another_tenants_conversation_is_not_found_on_every_route(
    start_fake_server: StartServer,
) -> None:
    _, a, b = await two_tenants(start_fake_server)
    hello = [{"type": "message", "role": "user", "content": "hello"}]
    conv = await in_thread(a.conversations.create, items=hello, metadata={"k": "v"})
    item_id = (await in_thread(a.conversations.items.list, conv.id)).data[0].id
    routes = conversation_routes(b, conv.id, item_id)
    refused = [await not_found(f, *args, **kw) for f, args, kw in routes]
    assert (await in_thread(a.conversations.retrieve, conv.id)).metadata == {"k": "v"}
    listed = await in_thread(a.conversations.items.list, conv.id)
    assert [item.id for item in listed.data] == [item_id]
    await in_thread(a.conversations.delete, conv.id)
    routes = conversation_routes(a, conv.id, item_id)
    missing = [await not_found(f, *args, **kw) for f, args, kw in routes]
    assert refused == missing


async def test_a_free_form_conversation_id_is_each_tenants_own(
    start_fake_server: StartServer,
) -> None:
    _, a, b = await two_tenants(start_fake_server)
    for client, word in ((a, "alpha"), (b, "beta"), (a, "gamma")):
        resp = await in_thread(
            client.responses.create,
            model="fake-model",
            input=f"echo: {word}",
            conversation="default",
        )
        assert resp.output_text == word
        assert resp.conversation is not None
        assert resp.conversation.id == "default"
    texts: dict[str, list[str]] = {}
    for key, client in zip(KEYS, (a, b), strict=True):
        conv = await in_thread(client.conversations.retrieve, "default")
        assert conv.id == "default"
        items = await in_thread(client.conversations.items.list, "default", order="asc")
        texts[key] = [part.text for item in items.data for part in item.content]  # type: ignore[union-attr]
    assert texts["key-a"] == ["echo: alpha", "alpha", "echo: gamma", "gamma"]
    assert texts["key-b"] == ["echo: beta", "beta"]
    # One tenant deleting its "default" leaves the other's.
    await in_thread(b.conversations.delete, "default")
    assert (await in_thread(a.conversations.retrieve, "default")).id == "default"
    await not_found(b.conversations.retrieve, "default")


async def test_chains_and_item_references_do_not_cross_tenants(
    start_fake_server: StartServer,
) -> None:
    server, a, b = await two_tenants(start_fake_server)
    first = await in_thread(a.responses.create, model="fake-model", input="echo: private words")
    message_id = first.output[0].id
    reference = [
        {"type": "item_reference", "id": message_id},
        {"role": "user", "content": "echo: and so"},
    ]
    with pytest.raises(openai.BadRequestError) as chained:
        await in_thread(
            b.responses.create,
            model="fake-model",
            input="echo: next",
            previous_response_id=first.id,
        )
    assert chained.value.code == "previous_response_not_found"
    with pytest.raises(openai.BadRequestError) as referenced:
        await in_thread(b.responses.create, model="fake-model", input=reference)
    assert referenced.value.code == "item_not_found"
    headers = {"Authorization": f"Bearer {KEYS[1]}"}
    async with httpx.AsyncClient(base_url=server.url, timeout=30, headers=headers) as http:
        counted = await http.post(
            "/v1/responses/input_tokens",
            json={"input": "echo: next", "previous_response_id": first.id},
        )
        compacted = await http.post(
            "/v1/responses/compact",
            json={"model": "fake-model", "input": reference},
        )
    assert counted.status_code == 400
    assert counted.json()["error"]["code"] == "previous_response_not_found"
    assert compacted.status_code == 400
    assert compacted.json()["error"]["code"] == "item_not_found"
    # Its own tenant continues both ways.
    follow = await in_thread(
        a.responses.create, model="fake-model", input="echo: next", previous_response_id=first.id
    )
    assert follow.status == "completed"
    resolved = await in_thread(a.responses.create, model="fake-model", input=reference)
    assert resolved.status == "completed"


async def test_cancelling_another_tenants_job_is_not_found_and_it_runs_on(
    start_fake_server: StartServer,
) -> None:
    engine = FakeEngine()
    engine.hold()  # one job runs and one waits until released
    _, a, b = await two_tenants(start_fake_server, engine, parallel=1)
    jobs = [
        await in_thread(
            a.responses.create,
            model="fake-model",
            input=LONG,
            background=True,
            max_output_tokens=60,
        )
        for _ in range(2)
    ]
    with trio.fail_after(5):
        await wait_until(lambda: engine.active == 1 and engine.held > 2)
    assert (await in_thread(a.responses.retrieve, jobs[1].id)).status == "queued"
    for job in jobs:  # one running, one queued
        await not_found(b.responses.cancel, job.id)
        await not_found(b.responses.retrieve, job.id)
    engine.release()
    for job in jobs:
        final = await poll(a, job.id)
        assert final.status == "incomplete"  # it ran to its max_output_tokens
        assert final.incomplete_details is not None
        assert final.incomplete_details.reason == "max_output_tokens"


async def test_reasoning_echo_never_gives_one_tenant_anothers_trace(
    start_fake_server: StartServer,
) -> None:
    server, a, _ = await two_tenants(start_fake_server)
    first_input = [{"role": "user", "content": "echo: <think>secret plan</think> answer"}]
    first = await in_thread(
        a.responses.create, model="fake-model", input=first_input, prompt_cache_key="s1"
    )
    assert [item.type for item in first.output] == ["reasoning", "message"]
    follow = [*first_input, first.output[1].model_dump(), {"role": "user", "content": "echo: n"}]
    body = {"model": "fake-model", "input": follow, "prompt_cache_key": "s1"}
    tokens = {}
    for key in KEYS:
        headers = {"Authorization": f"Bearer {key}"}
        async with httpx.AsyncClient(base_url=server.url, timeout=30, headers=headers) as http:
            r = await http.post("/v1/responses", json=body)
        tokens[key] = r.json()["usage"]["input_tokens"]
    # Its own tenant gets the dropped trace back (a longer prompt); the other does not.
    assert tokens["key-b"] < tokens["key-a"]
