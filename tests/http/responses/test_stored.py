"""Stored responses, chains, conversations, cancel and token counting (fake engine)."""

from __future__ import annotations

from typing import Any

import httpx
import openai
import pytest
import trio

from mlxcel.config import StoreLimits
from mlxcel.model.fake import FakeEngine

from support import LONG, FakeServer, StartServer, count, in_thread, post, wait_until


@pytest.fixture(params=["memory", "sqlite", "redis"])
def fake_store(request: pytest.FixtureRequest) -> str:
    """Every test here runs on every store backend."""
    return str(request.param)


async def test_retrieve_equals_create_and_delete(fake_server: FakeServer) -> None:
    client = fake_server.client()
    created = await in_thread(client.responses.create, model="fake-model", input="echo: kept")
    fetched = await in_thread(client.responses.retrieve, created.id)
    assert fetched.model_dump() == created.model_dump()
    deleted = await in_thread(client.responses.delete, created.id)
    assert deleted is None  # the SDK returns nothing for a 200 delete
    with pytest.raises(openai.NotFoundError):
        await in_thread(client.responses.retrieve, created.id)
    with pytest.raises(openai.NotFoundError):
        await in_thread(client.responses.delete, created.id)


async def test_delete_body_and_malformed_ids(fake_server: FakeServer) -> None:
    client = fake_server.client()
    created = await in_thread(client.responses.create, model="fake-model", input="echo: x")
    async with httpx.AsyncClient(base_url=fake_server.url, timeout=30) as http:
        r = await http.delete(f"/responses/{created.id}")
        assert r.json() == {"id": created.id, "object": "response.deleted", "deleted": True}
        for bad in ("nope", "resp_unknown"):
            r = await http.get(f"/v1/responses/{bad}")
            assert r.status_code == (400 if bad == "nope" else 404)
            assert set(r.json()["error"]) == {"message", "type", "param", "code"}


async def test_store_false_is_not_retrievable(fake_server: FakeServer) -> None:
    client = fake_server.client()
    created = await in_thread(
        client.responses.create, model="fake-model", input="echo: x", store=False
    )
    assert created.store is False
    with pytest.raises(openai.NotFoundError):
        await in_thread(client.responses.retrieve, created.id)
    r = await post(
        fake_server,
        "/v1/responses",
        {"model": "fake-model", "input": "hi", "previous_response_id": created.id},
    )
    assert r.status_code == 400
    assert r.json()["error"]["message"] == (
        f"previous response '{created.id}' was not found or has expired"
    )


async def test_three_hop_chain_sees_every_turn(fake_server: FakeServer) -> None:
    client = fake_server.client()
    a = await in_thread(
        client.responses.create, model="fake-model", input="echo: alpha", instructions="only for A"
    )
    b = await in_thread(
        client.responses.create, model="fake-model", input="echo: beta", previous_response_id=a.id
    )
    assert b.previous_response_id == a.id
    assert b.instructions is None
    hop3 = {"model": "fake-model", "input": "echo: gamma", "previous_response_id": b.id}
    explicit = {
        "model": "fake-model",
        "input": [
            {"role": "user", "content": "echo: alpha"},
            {"role": "assistant", "content": "alpha"},
            {"role": "user", "content": "echo: beta"},
            {"role": "assistant", "content": "beta"},
            {"role": "user", "content": "echo: gamma"},
        ],
    }
    assert await count(fake_server, hop3) == await count(fake_server, explicit)
    # Instructions are never inherited: adding A's would change the count.
    with_instructions = {**explicit, "instructions": "only for A"}
    assert await count(fake_server, hop3) != await count(fake_server, with_instructions)
    c = await in_thread(client.responses.create, **hop3)
    assert c.output_text == "gamma"
    assert c.usage is not None
    assert c.usage.input_tokens == await count(fake_server, explicit)


async def test_chain_errors(fake_server: FakeServer) -> None:
    r = await post(
        fake_server,
        "/v1/responses",
        {"model": "fake-model", "input": "x", "previous_response_id": "resp_missing"},
    )
    assert r.status_code == 400
    assert "resp_missing" in r.json()["error"]["message"]
    assert r.json()["error"]["param"] == "previous_response_id"
    r = await post(
        fake_server,
        "/v1/responses",
        {
            "model": "fake-model",
            "input": "x",
            "previous_response_id": "resp_a",
            "conversation": "conv_a",
        },
    )
    assert r.status_code == 400


async def test_conversation_across_two_turns(fake_server: FakeServer) -> None:
    client = fake_server.client()
    first = await in_thread(
        client.responses.create,
        model="fake-model",
        input="echo: one",
        conversation="conv_two_turns",
    )
    assert first.conversation is not None
    assert first.conversation.id == "conv_two_turns"
    turn2 = {"model": "fake-model", "input": "echo: two", "conversation": {"id": "conv_two_turns"}}
    explicit = {
        "model": "fake-model",
        "input": [
            {"role": "user", "content": "echo: one"},
            {"role": "assistant", "content": "one"},
            {"role": "user", "content": "echo: two"},
        ],
    }
    assert await count(fake_server, turn2) == await count(fake_server, explicit)
    second = await in_thread(client.responses.create, **turn2)
    assert second.output_text == "two"


async def test_disabled_stores_answer_400(start_fake_server: StartServer) -> None:
    server = await start_fake_server(
        responses=StoreLimits(0, 1 << 20, 0), conversations=StoreLimits(0, 1 << 20, 0)
    )
    client = server.client()
    created = await in_thread(client.responses.create, model="fake-model", input="echo: x")
    async with httpx.AsyncClient(base_url=server.url, timeout=30) as http:
        for method, path in (("GET", ""), ("DELETE", ""), ("POST", "/cancel")):
            r = await http.request(method, f"/v1/responses/{created.id}{path}")
            assert r.status_code == 400, (method, path)
    for extra in ({"previous_response_id": created.id}, {"conversation": "conv_x"}):
        r = await post(server, "/v1/responses", {"model": "fake-model", "input": "x", **extra})
        assert r.status_code == 400


async def test_zero_byte_budget_keeps_routes_alive(start_fake_server: StartServer) -> None:
    server = await start_fake_server(responses=StoreLimits(10, 0, 0))
    client = server.client()
    created = await in_thread(client.responses.create, model="fake-model", input="echo: x")
    with pytest.raises(openai.NotFoundError):
        await in_thread(client.responses.retrieve, created.id)


async def test_each_limit_on_its_own_server(start_fake_server: StartServer) -> None:
    # The fake clock cannot drive a real HTTP server, so the TTL here is real and short.
    entries = await start_fake_server(FakeEngine(), responses=StoreLimits(1, 1 << 20, 0))
    ttl = await start_fake_server(FakeEngine(), responses=StoreLimits(10, 1 << 20, 0.5))
    size = await stored_bytes(ttl, "echo: a")  # what one such response costs the budget
    budget = await start_fake_server(FakeEngine(), responses=StoreLimits(10, size * 5 // 2, 0))
    for server in (entries, ttl, budget):
        client = server.client()
        a = await in_thread(client.responses.create, model="fake-model", input="echo: a")
        if server is ttl:
            await trio.sleep(0.6)
        if server is budget:  # the budget holds two
            for _ in range(2):
                await in_thread(client.responses.create, model="fake-model", input="echo: c")
        b = await in_thread(client.responses.create, model="fake-model", input="echo: b")
        with pytest.raises(openai.NotFoundError):
            await in_thread(client.responses.retrieve, a.id)
        assert (await in_thread(client.responses.retrieve, b.id)).id == b.id


async def stored_bytes(server: FakeServer, text: str) -> int:
    """The bytes one stored response to `text` takes (the server's store is left as it
    was)."""
    created = await in_thread(server.client().responses.create, model="fake-model", input=text)
    async with httpx.AsyncClient(base_url=server.url) as http:
        metrics = (await http.get("/metrics")).text
    await in_thread(server.client().responses.delete, created.id)
    line = next(
        x for x in metrics.splitlines() if x.startswith('mlxcel_store_bytes{table="responses"}')
    )
    return int(float(line.split()[-1]))


async def test_input_tokens_equals_usage(fake_server: FakeServer) -> None:
    client = fake_server.client()
    body = {"model": "fake-model", "input": "echo: count me", "instructions": "be kind"}
    created = await in_thread(client.responses.create, **body)
    assert created.usage is not None
    assert await count(fake_server, body) == created.usage.input_tokens
    sdk = await in_thread(
        client.responses.input_tokens.count,
        model="fake-model",
        input="echo: count me",
        instructions="be kind",
    )
    assert sdk.input_tokens == created.usage.input_tokens
    r = await post(fake_server, "/v1/responses/input_tokens", {"input": 5})
    assert r.status_code == 400


async def test_input_items_pages(fake_server: FakeServer) -> None:
    client = fake_server.client()
    items = [{"role": "user", "content": f"echo: {i}"} for i in range(5)]
    created = await in_thread(client.responses.create, model="fake-model", input=items)
    page = await in_thread(client.responses.input_items.list, created.id, limit=2, order="asc")
    assert [i.content[0].text for i in page.data] == ["echo: 0", "echo: 1"]  # type: ignore[union-attr]
    assert page.has_more
    rest = await in_thread(
        client.responses.input_items.list, created.id, order="asc", after=page.data[-1].id
    )
    assert len(rest.data) == 3
    assert not rest.has_more
    desc = await in_thread(client.responses.input_items.list, created.id)
    assert desc.data[0].content[0].text == "echo: 4"  # type: ignore[union-attr]


async def test_cancel_stops_a_stream_and_stores_cancelled(
    start_fake_server: StartServer,
) -> None:
    engine = FakeEngine()
    engine.hold()  # the stream runs until cancelled
    server = await start_fake_server(engine, parallel=1)
    client = server.client()
    seen: dict[str, Any] = {}

    def stream() -> None:
        with client.responses.stream(model="fake-model", input=LONG, max_output_tokens=1000) as s:
            for event in s:
                if event.type == "response.created":
                    seen["id"] = event.response.id
                seen["last"] = event

    async with trio.open_nursery() as nursery:
        nursery.start_soon(in_thread, stream)
        with trio.fail_after(5):
            await wait_until(lambda: engine.held > 3 and "id" in seen)
        cancelled = await in_thread(client.responses.cancel, seen["id"])
        assert cancelled.status == "cancelled"
    assert seen["last"].type == "response.failed"
    assert seen["last"].response.status == "cancelled"
    stored = await in_thread(client.responses.retrieve, seen["id"])
    assert stored.status == "cancelled"
    engine.release()  # were it still there, it would now run to its end
    with trio.fail_after(5):  # the model thread drops it at its next step
        await wait_until(lambda: engine.active == 0)
    assert engine.steps - engine.held < 10  # no step ran it after the release
    again = await in_thread(client.responses.cancel, seen["id"])
    assert again.model_dump() == stored.model_dump()


async def test_cancel_finished_returns_it_unchanged_and_unknown_is_404(
    fake_server: FakeServer,
) -> None:
    client = fake_server.client()
    done = await in_thread(client.responses.create, model="fake-model", input="echo: done")
    after = await in_thread(client.responses.cancel, done.id)
    assert after.model_dump() == done.model_dump()
    with pytest.raises(openai.NotFoundError):
        await in_thread(client.responses.cancel, "resp_unknown")


async def test_cancel_a_queued_request(start_fake_server: StartServer) -> None:
    engine = FakeEngine()
    engine.hold()  # the running request runs until released
    server = await start_fake_server(engine, parallel=1, max_queue_depth=2)
    client = server.client()
    queued_ids: list[str] = []
    results: dict[str, Any] = {}

    def running() -> None:
        results["running"] = client.responses.create(
            model="fake-model", input=LONG, max_output_tokens=30
        )

    def queued() -> None:
        with client.responses.stream(model="fake-model", input="echo: never") as s:
            for event in s:
                if event.type == "response.created":
                    queued_ids.append(event.response.id)
                results["queued"] = event

    async with trio.open_nursery() as nursery:
        nursery.start_soon(in_thread, running)
        with trio.fail_after(5):
            await wait_until(lambda: engine.steps > 0)
        nursery.start_soon(in_thread, queued)
        with trio.fail_after(5):
            await wait_until(lambda: bool(queued_ids))
        cancelled = await in_thread(client.responses.cancel, queued_ids[0])
        assert cancelled.status == "cancelled"
        assert "running" not in results  # it is still generating
        engine.release()
    assert results["queued"].type == "response.failed"
    assert results["queued"].response.status == "cancelled"
    assert results["running"].output_text.startswith("w0 w1")
    stored = await in_thread(client.responses.retrieve, queued_ids[0])
    assert stored.status == "cancelled"


async def test_huge_and_malformed_bodies_leave_the_store_intact(fake_server: FakeServer) -> None:
    client = fake_server.client()
    kept = await in_thread(client.responses.create, model="fake-model", input="echo: kept")
    async with httpx.AsyncClient(base_url=fake_server.url, timeout=60) as http:
        huge = await http.post(
            "/v1/responses",
            content=b"x" * (65 * 1024 * 1024),
            headers={"content-type": "application/json"},
        )
        assert huge.status_code == 413
        assert huge.json()["error"]["code"] == "request_too_large"
        for body in (
            {"model": "fake-model", "input": [{"x": 1}]},
            {"model": "fake-model", "input": "x", "previous_response_id": 5},
            {"model": "fake-model", "input": "x", "conversation": {"id": 5}},
        ):
            assert (await http.post("/v1/responses", json=body)).status_code == 400
    assert (await in_thread(client.responses.retrieve, kept.id)).model_dump() == kept.model_dump()


async def test_conversation_limits_each_on_its_own_server(start_fake_server: StartServer) -> None:
    entries = await start_fake_server(conversations=StoreLimits(1, 1 << 20, 0))
    ttl = await start_fake_server(conversations=StoreLimits(10, 1 << 20, 0.5))
    budget = await start_fake_server(conversations=StoreLimits(10, 0, 0))
    for server in (entries, ttl, budget):
        client = server.client()
        await in_thread(
            client.responses.create, model="fake-model", input="echo: a", conversation="conv_a"
        )
        if server is entries:  # a second conversation evicts the first
            await in_thread(
                client.responses.create, model="fake-model", input="echo: b", conversation="conv_b"
            )
        if server is ttl:
            await trio.sleep(0.6)
        with pytest.raises(openai.NotFoundError):
            await in_thread(client.conversations.retrieve, "conv_a")
