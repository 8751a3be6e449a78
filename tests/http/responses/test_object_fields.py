"""Every response object carries every field the API's schemas require, on every path:
create, retrieve, each stream event that embeds the response, a background job from
queued to its end, its event log, and cancel; and `/responses/compact`'s object (fake engine, real HTTP: the `openai` SDK's
raw responses, httpx for the streams). `checked_response` (`tests/helpers/object_fields.py`)
is the validating client."""

from __future__ import annotations

from typing import Any

import httpx
import openai
import pytest
import trio

from mlxcel.model.fake import FakeEngine

from object_fields import check_compaction, checked_response
from sse_frames import frames, sdk_event
from support import LONG, FakeServer, StartServer, an_ordinary_request_completes, in_thread

PARAMETERS = {"type": "object", "properties": {"city": {"type": "string"}}}
TOOLS: list[dict[str, Any]] = [
    {"type": "function", "name": "get_weather", "parameters": PARAMETERS},
    {"type": "function", "name": "get_time", "parameters": PARAMETERS, "strict": False},
    {"type": "function", "name": "get_date", "strict": True},
    {"type": "function", "name": "get_moon", "strict": None},
]
STRICT = [True, False, True, True]
"""Each tool's `strict` as echoed: as sent, else the API's default, `true`."""
EMBEDDING = frozenset(
    {
        "response.created",
        "response.in_progress",
        "response.queued",
        "response.completed",
        "response.failed",
        "response.incomplete",
    }
)
TERMINAL = ("completed", "incomplete", "failed", "cancelled")


def raw(answer: Any) -> dict[str, Any]:
    """The JSON body of an SDK call made `with_raw_response`."""
    body: dict[str, Any] = answer.http_response.json()
    return body


def shown_defaults(body: dict[str, Any], *, background: bool = False) -> None:
    checked_response(body)
    assert (body["presence_penalty"], body["frequency_penalty"]) == (0, 0)
    assert body["background"] is background


async def test_create_and_retrieve_carry_every_field(fake_server: FakeServer) -> None:
    client = fake_server.client()
    created = raw(
        await in_thread(
            client.responses.with_raw_response.create,
            model="fake-model",
            input="echo: fine",
            tools=TOOLS,
        )
    )
    retrieved = raw(await in_thread(client.responses.with_raw_response.retrieve, created["id"]))
    for body in (created, retrieved):
        shown_defaults(body)
        assert [tool["strict"] for tool in body["tools"]] == STRICT
        assert body["tools"][0]["parameters"] == PARAMETERS  # the rest as sent
    await an_ordinary_request_completes(fake_server)


async def test_sent_penalties_are_echoed(fake_server: FakeServer) -> None:
    client = fake_server.client()
    created = raw(
        await in_thread(
            client.responses.with_raw_response.create,
            model="fake-model",
            input="echo: fine",
            extra_body={"presence_penalty": 0.5, "frequency_penalty": -1.25},
        )
    )
    retrieved = raw(await in_thread(client.responses.with_raw_response.retrieve, created["id"]))
    for body in (created, retrieved):
        checked_response(body)
        assert (body["presence_penalty"], body["frequency_penalty"]) == (0.5, -1.25)


@pytest.mark.parametrize(
    ("extra", "param"),
    [
        ({"presence_penalty": 2.5}, "presence_penalty"),
        ({"frequency_penalty": "high"}, "frequency_penalty"),
        ({"tools": [{**TOOLS[0], "strict": "yes"}]}, "tools[0].strict"),
    ],
)
async def test_bad_penalties_and_strict_flags_are_400(
    fake_server: FakeServer, extra: dict[str, Any], param: str
) -> None:
    client = fake_server.client()
    with pytest.raises(openai.BadRequestError) as caught:
        await in_thread(
            client.responses.create, model="fake-model", input="echo: x", extra_body=extra
        )
    error = caught.value.body
    assert isinstance(error, dict)
    assert error["param"] == param
    assert error["type"] == "invalid_request_error"
    await an_ordinary_request_completes(fake_server)


async def stream_frames(server: FakeServer, body: dict[str, Any]) -> list[tuple[str, Any]]:
    async with httpx.AsyncClient(base_url=server.url, timeout=30) as http:
        r = await http.post("/v1/responses", json={"model": "fake-model", **body, "stream": True})
    assert r.status_code == 200, r.text
    return [(name or "", data) for name, data in frames(r.content)]


def embedded(events: list[tuple[str, Any]]) -> list[str]:
    """The names of the events that embed the response, each checked as the SDK's event
    and its response as the API's object."""
    names = []
    for name, data in events:
        if "response" in data:
            assert name in EMBEDDING
            sdk_event(data)
            checked_response(data["response"])
            names.append(name)
    return names


@pytest.mark.parametrize(
    ("body", "last"),
    [
        ({"input": "echo: fine", "tools": TOOLS}, "response.completed"),
        ({"input": LONG, "max_output_tokens": 3}, "response.incomplete"),
    ],
)
async def test_every_stream_event_that_embeds_the_response_carries_every_field(
    fake_server: FakeServer, body: dict[str, Any], last: str
) -> None:
    events = await stream_frames(fake_server, body)
    assert embedded(events) == ["response.created", "response.in_progress", last]
    await an_ordinary_request_completes(fake_server)


async def test_a_failed_stream_carries_every_field(start_fake_server: StartServer) -> None:
    server = await start_fake_server(FakeEngine(fail_on="boom"))
    events = await stream_frames(server, {"input": "echo: a boom"})
    assert embedded(events)[-1] == "response.failed"
    await an_ordinary_request_completes(server)


async def poll_raw(server: FakeServer, response_id: str) -> list[dict[str, Any]]:
    """Every object a client polling the response sees, until the one that ends it."""
    seen: list[dict[str, Any]] = []
    async with httpx.AsyncClient(base_url=server.url, timeout=30) as http:
        with trio.fail_after(20):
            while not seen or seen[-1]["status"] not in TERMINAL:
                r = await http.get(f"/v1/responses/{response_id}")
                assert r.status_code == 200, r.text
                seen.append(r.json())
                await trio.sleep(0.01)
    return seen


async def test_a_background_job_carries_every_field_from_queued_to_its_end(
    fake_server: FakeServer,
) -> None:
    client = fake_server.client()
    queued = raw(
        await in_thread(
            client.responses.with_raw_response.create,
            model="fake-model",
            input="echo: later",
            background=True,
            tools=TOOLS,
        )
    )
    polled = await poll_raw(fake_server, queued["id"])
    for body in (queued, *polled):
        shown_defaults(body, background=True)
        assert [tool["strict"] for tool in body["tools"]] == STRICT
    assert polled[-1]["status"] == "completed"
    async with httpx.AsyncClient(base_url=fake_server.url, timeout=30) as http:
        r = await http.get(f"/v1/responses/{queued['id']}", params={"stream": "true"})
    assert r.status_code == 200, r.text
    names = embedded([(name or "", data) for name, data in frames(r.content)])
    assert names[:2] == ["response.created", "response.queued"]
    assert names[-1] == "response.completed"
    await an_ordinary_request_completes(fake_server)


async def test_cancel_answers_an_object_with_every_field(start_fake_server: StartServer) -> None:
    engine = FakeEngine()
    engine.hold()  # the job stays unfinished until it is cancelled
    server = await start_fake_server(engine)
    client = server.client()
    job = raw(
        await in_thread(
            client.responses.with_raw_response.create,
            model="fake-model",
            input=LONG,
            background=True,
        )
    )
    cancelled = raw(await in_thread(client.responses.with_raw_response.cancel, job["id"]))
    engine.release()
    assert cancelled["status"] == "cancelled"
    shown_defaults(cancelled, background=True)
    [final] = await poll_raw(server, job["id"])
    shown_defaults(final, background=True)
    assert final["status"] == "cancelled"
    await an_ordinary_request_completes(server)


async def test_the_compacted_object_carries_every_field(fake_server: FakeServer) -> None:
    turns: list[dict[str, Any]] = [{"role": "developer", "content": "Answer in English."}]
    for n in range(4):
        turns.append({"role": "user", "content": f"turn {n}: " + "lorem ipsum " * 15})
        turns.append({"role": "assistant", "content": f"answer {n}: " + "dolor sit " * 15})
    turns.append({"role": "user", "content": "echo: And now?"})
    client = fake_server.client()
    body = raw(
        await in_thread(
            client.responses.with_raw_response.compact,
            model="fake-model",
            input=turns,
            extra_body={"keep_tokens": 50},
        )
    )
    check_compaction(body)
    assert [item["type"] for item in body["output"]] == ["message", "message", "compaction"]
    await an_ordinary_request_completes(fake_server)
