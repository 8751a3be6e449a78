"""`item_reference` input items resolved from the response store, over real HTTP with the
`openai` SDK on the fake engine."""

from __future__ import annotations

from typing import Any

import httpx
import openai
import pytest
import trio

from mlxcel.config import StoreLimits

from support import FakeServer, StartServer, in_thread


async def post(server: FakeServer, body: dict[str, Any]) -> httpx.Response:
    async with httpx.AsyncClient(timeout=60) as http:
        return await http.post(f"{server.url}/v1/responses", json={"model": "fake-model", **body})


@pytest.fixture(params=["memory", "sqlite", "redis"])
def fake_store(request: pytest.FixtureRequest) -> str:
    """Every test here runs on every store backend."""
    return str(request.param)


async def test_a_reference_to_a_stored_output_item_is_that_item(fake_server: FakeServer) -> None:
    client = fake_server.client()
    first = await in_thread(client.responses.create, model="fake-model", input="echo: blue sky")
    answer = first.output[0]
    assert answer.id is not None
    second = await in_thread(
        client.responses.create,
        model="fake-model",
        input=[
            {"role": "user", "content": "what colour?"},
            {"type": "item_reference", "id": answer.id},
            {"role": "user", "content": "echo: again"},
        ],
    )
    assert second.output_text == "again"
    prompt = fake_server.engine.prompts[-1]
    assert "\x01user\x02what colour?\x01assistant\x02blue sky\x01user\x02echo: again" in prompt
    # The new response keeps the referenced item among its input items.
    items = await in_thread(client.responses.input_items.list, second.id, order="asc")
    assert [i.id for i in items.data][1] == answer.id
    assert items.data[1].type == "message"


async def test_a_reference_to_a_stored_input_item_and_one_without_type(
    fake_server: FakeServer,
) -> None:
    client = fake_server.client()
    first = await in_thread(
        client.responses.create,
        model="fake-model",
        input=[
            {"role": "developer", "content": "Be terse."},
            {"role": "user", "content": "echo: ok"},
        ],
    )
    listed = await in_thread(client.responses.input_items.list, first.id, order="asc")
    developer_id = listed.data[0].id
    assert developer_id.startswith("msg_")  # ids given to input items sent without one
    r = await post(
        fake_server,
        {
            "input": [
                {"id": developer_id},
                {"type": None, "id": developer_id},
                {"role": "user", "content": "echo: x"},
            ]
        },
    )
    assert r.status_code == 200, r.text
    assert (
        "\x01system\x02Be terse.\x01system\x02Be terse.\x01user" in fake_server.engine.prompts[-1]
    )


async def test_a_reference_to_a_function_call_and_its_output(fake_server: FakeServer) -> None:
    client = fake_server.client()
    tool = {"type": "function", "name": "f", "parameters": {"type": "object", "properties": {}}}
    first = await in_thread(
        client.responses.create,
        model="fake-model",
        input='echo: {"name": "f", "arguments": {}}',
        tools=[tool],  # type: ignore[list-item]
    )
    (call,) = first.output
    assert call.type == "function_call"
    assert call.id is not None
    assert call.id.startswith("fc_")
    second = await in_thread(
        client.responses.create,
        model="fake-model",
        tools=[tool],  # type: ignore[list-item]
        input=[
            {"role": "user", "content": "call f"},
            {"type": "item_reference", "id": call.id},
            {"type": "function_call_output", "call_id": call.call_id, "output": "done"},
        ],
    )
    assert second.status == "completed"


async def test_an_unknown_id_is_a_400_naming_the_item(fake_server: FakeServer) -> None:
    client = fake_server.client()
    with pytest.raises(openai.BadRequestError) as caught:
        await in_thread(
            client.responses.create,
            model="fake-model",
            input=[
                {"role": "user", "content": "a"},
                {"role": "user", "content": "b"},
                {"role": "user", "content": "c"},
                {"type": "item_reference", "id": "msg_nope"},
            ],
        )
    body = caught.value.body
    assert isinstance(body, dict)
    assert body["param"] == "input[3].id"
    assert "msg_nope" in body["message"]
    assert body["type"] == "invalid_request_error"


async def test_a_deleted_response_takes_its_items_with_it(fake_server: FakeServer) -> None:
    client = fake_server.client()
    first = await in_thread(client.responses.create, model="fake-model", input="echo: gone")
    item_id = first.output[0].id
    await in_thread(client.responses.delete, first.id)
    r = await post(fake_server, {"input": [{"type": "item_reference", "id": item_id}]})
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == "input[0].id"


async def test_an_item_stored_twice_outlives_either_copy(fake_server: FakeServer) -> None:
    client = fake_server.client()
    first = await in_thread(client.responses.create, model="fake-model", input="echo: kept")
    item_id = first.output[0].id
    assert item_id is not None
    second = await in_thread(
        client.responses.create,
        model="fake-model",
        input=[{"type": "item_reference", "id": item_id}, {"role": "user", "content": "more"}],
    )
    await in_thread(client.responses.delete, second.id)  # the newer copy goes
    r = await post(
        fake_server,
        {"input": [{"type": "item_reference", "id": item_id}, {"role": "user", "content": "x"}]},
    )
    assert r.status_code == 200, r.text  # the first response still holds it


async def test_store_false_requests_resolve_references_but_leave_none(
    fake_server: FakeServer,
) -> None:
    client = fake_server.client()
    stored = await in_thread(client.responses.create, model="fake-model", input="echo: saved")
    unstored = await in_thread(
        client.responses.create,
        model="fake-model",
        store=False,
        input=[
            {"type": "item_reference", "id": stored.output[0].id},
            {"role": "user", "content": "echo: fine"},
        ],
    )
    assert unstored.output_text == "fine"
    r = await post(
        fake_server,
        {
            "input": [
                {"type": "item_reference", "id": unstored.output[0].id},
                {"role": "user", "content": "x"},
            ]
        },
    )
    assert r.status_code == 400, r.text


async def test_with_the_store_off_a_reference_is_a_400_that_says_so(
    start_fake_server: StartServer,
) -> None:
    server = await start_fake_server(responses=StoreLimits(0, 0, 0))
    r = await post(server, {"input": [{"type": "item_reference", "id": "msg_1"}]})
    assert r.status_code == 400, r.text
    assert "storage is off" in r.json()["error"]["message"]


@pytest.mark.parametrize(
    "reference",
    [
        {"type": "item_reference", "id": 7},
        {"type": "item_reference", "id": None},
        {"type": "item_reference"},
        {"type": "item_reference", "id": ""},
        {"type": "item_reference", "id": "x" * 10_000},
        {"type": "item_reference", "id": ["msg_1"]},
    ],
    ids=["number", "null", "missing", "empty", "huge", "list"],
)
async def test_bad_reference_ids_are_400(fake_server: FakeServer, reference: Any) -> None:
    r = await post(fake_server, {"input": [{"role": "user", "content": "x"}, reference]})
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"].startswith("input[1]")


async def test_many_references_are_one_lookup_and_a_clean_answer(fake_server: FakeServer) -> None:
    client = fake_server.client()
    first = await in_thread(client.responses.create, model="fake-model", input="echo: a")
    item_id = first.output[0].id
    # Far more than the window holds: refused by the early count, not looked up one by one.
    many = [{"type": "item_reference", "id": item_id}] * 50_000
    r = await post(fake_server, {"input": many})
    assert r.status_code == 400, r.text
    # Within the count, the same id many times over resolves each time.
    some = [{"type": "item_reference", "id": item_id}] * 200 + [{"role": "user", "content": "x"}]
    r = await post(fake_server, {"input": some, "max_output_tokens": 1})
    assert r.status_code == 200, r.text
    assert fake_server.engine.prompts[-1].count("\x01assistant\x02a") == 200
    # Many distinct unknown ids: the first is named.
    unknown = [{"type": "item_reference", "id": f"msg_{i}"} for i in range(2000)]
    r = await post(fake_server, {"input": unknown})
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == "input[0].id"


async def test_references_are_not_conversation_items(fake_server: FakeServer) -> None:
    async with httpx.AsyncClient(timeout=30) as http:
        r = await http.post(
            f"{fake_server.url}/v1/conversations",
            json={"items": [{"type": "item_reference", "id": "msg_1"}]},
        )
    assert r.status_code == 400, r.text


async def test_a_background_request_resolves_references_before_it_is_queued(
    fake_server: FakeServer,
) -> None:
    client = fake_server.client()
    first = await in_thread(client.responses.create, model="fake-model", input="echo: later")
    job = await in_thread(
        client.responses.create,
        model="fake-model",
        background=True,
        input=[
            {"type": "item_reference", "id": first.output[0].id},
            {"role": "user", "content": "echo: done"},
        ],
    )
    with trio.fail_after(30):
        while job.status in ("queued", "in_progress"):
            await trio.sleep(0.05)
            job = await in_thread(client.responses.retrieve, job.id)
    assert (job.status, job.output_text) == ("completed", "done")
    with pytest.raises(openai.BadRequestError):  # an unknown id is refused before any job
        await in_thread(
            client.responses.create,
            model="fake-model",
            background=True,
            input=[{"type": "item_reference", "id": "msg_unknown"}],
        )


async def test_input_tokens_counts_what_references_stand_for(fake_server: FakeServer) -> None:
    client = fake_server.client()
    first = await in_thread(client.responses.create, model="fake-model", input="echo: blue sky")
    answer = first.output[0]
    sent = [{"type": "item_reference", "id": answer.id}, {"role": "user", "content": "more"}]
    by_value = [answer.model_dump(exclude_none=True, warnings=False), sent[1]]
    counts = []
    async with httpx.AsyncClient(base_url=fake_server.url, timeout=60) as http:
        for body in (sent, by_value, [{"type": "item_reference", "id": "msg_gone"}]):
            r = await http.post(
                "/v1/responses/input_tokens", json={"model": "fake-model", "input": body}
            )
            counts.append(r)
    assert counts[0].status_code == counts[1].status_code == 200, counts[0].text
    assert counts[0].json()["input_tokens"] == counts[1].json()["input_tokens"]
    assert counts[2].status_code == 400
    assert counts[2].json()["error"]["param"] == "input[0].id"
