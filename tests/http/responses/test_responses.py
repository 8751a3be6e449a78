"""POST /v1/responses over real HTTP with the `openai` SDK, on the fake engine."""

from __future__ import annotations

import json

import httpx
import pytest
from openai.types.responses import Response

from mlxcel.model.fake import DEFAULT_REPLY

from support import FakeServer, StartServer, in_thread


async def test_sync_create_returns_an_sdk_response(fake_server: FakeServer) -> None:
    client = fake_server.client()
    resp = await in_thread(
        client.responses.create,
        model="fake-model",
        input="echo: hello there",
        max_output_tokens=64,
        metadata={"k": "v"},
    )
    assert isinstance(resp, Response)
    assert resp.id.startswith("resp_")
    assert resp.status == "completed"
    assert resp.output_text == "hello there"
    message = resp.output[0]
    assert message.type == "message"
    assert message.id.startswith("msg_")
    assert message.content[0].type == "output_text"
    assert message.content[0].annotations == []
    assert resp.usage is not None
    assert resp.usage.output_tokens == 2
    assert resp.usage.input_tokens > 0
    assert resp.usage.input_tokens_details.cached_tokens == 0
    assert resp.usage.output_tokens_details.reasoning_tokens == 0
    assert resp.usage.total_tokens == resp.usage.input_tokens + 2
    assert resp.metadata == {"k": "v"}
    assert resp.tools == []
    assert resp.tool_choice == "auto"
    assert resp.parallel_tool_calls is True
    assert resp.temperature == 1.0
    assert resp.max_output_tokens == 64
    assert resp.background is False


async def test_stream_helper_yields_final_response(fake_server: FakeServer) -> None:
    client = fake_server.client()

    def run() -> tuple[list[str], Response]:
        deltas = []
        with client.responses.stream(model="fake-model", input="hi") as stream:
            for event in stream:
                if event.type == "response.output_text.delta":
                    deltas.append(event.delta)
            return deltas, stream.get_final_response()

    deltas, final = await in_thread(run)
    assert "".join(deltas) == DEFAULT_REPLY
    assert final.output_text == DEFAULT_REPLY
    assert final.status == "completed"


async def _raw_events(url: str, body: dict[str, object]) -> list[tuple[str, dict[str, object]]]:
    events = []
    async with (
        httpx.AsyncClient(timeout=30) as http,
        http.stream("POST", f"{url}/v1/responses", json=body) as resp,
    ):
        assert resp.status_code == 200
        assert resp.headers["content-type"].startswith("text/event-stream")
        name = None
        async for line in resp.aiter_lines():
            if line.startswith("event: "):
                name = line.removeprefix("event: ")
            elif line.startswith("data: "):
                assert name is not None
                events.append((name, json.loads(line.removeprefix("data: "))))
                name = None
    return events


async def test_raw_sse_order_numbering_and_ids(fake_server: FakeServer) -> None:
    events = await _raw_events(
        fake_server.url, {"model": "fake-model", "input": "echo: one two three", "stream": True}
    )
    types = [name for name, _ in events]
    assert types == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
        "response.output_text.delta",
        "response.output_text.delta",
        "response.output_text.delta",
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.completed",
    ]
    assert all(data["type"] == name for name, data in events)
    assert [data["sequence_number"] for _, data in events] == list(range(len(events)))
    created = events[0][1]["response"]
    assert isinstance(created, dict)
    assert created["status"] == "in_progress"
    assert created["output"] == []
    added = events[2][1]["item"]
    assert isinstance(added, dict)
    assert added["status"] == "in_progress"
    assert added["content"] == []
    item_ids = {data["item_id"] for _, data in events if "item_id" in data}
    completed = events[-1][1]["response"]
    assert isinstance(completed, dict)
    assert item_ids == {completed["output"][0]["id"]} == {added["id"]}
    assert completed["id"] == created["id"]
    assert completed["output"][0]["content"][0]["text"] == "one two three"


async def test_length_stop_is_incomplete(fake_server: FakeServer) -> None:
    client = fake_server.client()
    resp = await in_thread(
        client.responses.create, model="fake-model", input="hi", max_output_tokens=3
    )
    assert resp.status == "incomplete"
    assert resp.incomplete_details is not None
    assert resp.incomplete_details.reason == "max_output_tokens"
    assert resp.output_text == "The quick brown"
    events = await _raw_events(
        fake_server.url,
        {"model": "fake-model", "input": "hi", "stream": True, "max_output_tokens": 2},
    )
    assert events[-1][0] == "response.incomplete"


async def test_input_item_arrays_and_echoed_assistant_output(fake_server: FakeServer) -> None:
    client = fake_server.client()
    first = await in_thread(client.responses.create, model="fake-model", input="echo: ok")
    history = [
        {"role": "user", "content": "echo: ok"},
        *[item.model_dump() for item in first.output],
        {
            "type": "message",
            "role": "developer",
            "content": [{"type": "input_text", "text": "be brief"}],
        },
        {"role": "assistant", "content": [{"type": "refusal", "refusal": "no"}]},
        {"role": "user", "content": [{"type": "input_text", "text": "echo: again"}]},
    ]
    resp = await in_thread(
        client.responses.create, model="fake-model", input=history, instructions="system words"
    )
    assert resp.output_text == "again"
    assert resp.instructions == "system words"


async def test_unknown_top_level_fields_are_ignored(fake_server: FakeServer) -> None:
    async with httpx.AsyncClient(timeout=30) as http:
        r = await http.post(
            f"{fake_server.url}/v1/responses",
            json={
                "model": "fake-model",
                "input": "echo: fine",
                "client_metadata": {"a": 1},
                "prompt_cache_key": "k",
                "include": ["reasoning.encrypted_content"],
                "reasoning": {"effort": "low"},
                "store": False,
                "brand_new_field": [1, 2],
            },
        )
    assert r.status_code == 200
    assert r.json()["output"][0]["content"][0]["text"] == "fine"
    assert r.json()["store"] is False


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"model": "fake-model", "input": 3}, "input"),
        ({"input": "hi"}, "model"),
        ({"model": "fake-model", "input": "hi", "temperature": 9}, "temperature"),
        ({"model": "fake-model", "input": "hi", "top_p": -1}, "top_p"),
        ({"model": "fake-model", "input": "hi", "max_output_tokens": 0}, "max_output_tokens"),
        ({"model": "fake-model", "input": "hi", "max_output_tokens": "many"}, "max_output_tokens"),
        ({"model": "fake-model", "input": [{"role": "robot", "content": "x"}]}, "input[0]"),
        ({"model": "fake-model", "input": [{"type": "input_image", "image_url": "x"}]}, "input[0]"),
        ({"model": "fake-model", "input": "hi", "truncation": "sometimes"}, "truncation"),
        ({"model": "fake-model", "input": "hi", "include": ["everything"]}, "include"),
        ({"model": "fake-model", "input": "hi", "text": {"verbosity": "loud"}}, "text.verbosity"),
        ({"model": "fake-model", "input": "hi", "max_tool_calls": 0}, "max_tool_calls"),
        ({"model": "fake-model", "input": "hi", "prompt": {"id": "pmpt_1"}}, "prompt"),
        (
            {"model": "fake-model", "input": "hi", "tools": [{"type": "web_search"}]},
            "tools[0].type",
        ),
        ({"model": "fake-model", "input": "hi", "stream": "yes"}, "stream"),
        ({"model": "fake-model", "input": []}, "input"),
    ],
)
async def test_bad_fields_get_openai_shaped_400(
    fake_server: FakeServer, body: dict[str, object], param: str
) -> None:
    async with httpx.AsyncClient(timeout=30) as http:
        r = await http.post(f"{fake_server.url}/v1/responses", json=body)
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["type"] == "invalid_request_error"
    assert error["param"] is not None
    assert error["param"].startswith(param)
    assert error["message"]


async def test_malformed_json_and_non_object_bodies_are_400(fake_server: FakeServer) -> None:
    async with httpx.AsyncClient(timeout=30) as http:
        for content in (b"{not json", b"[1, 2]", b"", "\xff".encode("latin-1")):
            r = await http.post(
                f"{fake_server.url}/v1/responses",
                content=content,
                headers={"content-type": "application/json"},
            )
            assert r.status_code == 400, content
            assert r.json()["error"]["type"] == "invalid_request_error"


@pytest.mark.parametrize(
    ("text", "param"),
    [
        (
            {"format": {"type": "json_schema", "name": "x", "schema": {"type": "nonsense"}}},
            "text.format.schema",
        ),
        ({"format": {"type": "json_schema", "schema": {"type": "object"}}}, "text.format.name"),
        ({"format": {"type": "json_schema", "name": "x"}}, "text.format.schema"),
        ({"format": {"type": "yaml"}}, "text.format.type"),
        ({"format": "json"}, "text.format"),
    ],
)
@pytest.mark.parametrize("background", [False, True])
async def test_bad_text_formats_are_400_at_create(
    fake_server: FakeServer, text: dict[str, object], param: str, background: bool
) -> None:
    body = {"model": "fake-model", "input": "hi", "text": text, "background": background}
    async with httpx.AsyncClient(timeout=30) as http:
        r = await http.post(f"{fake_server.url}/v1/responses", json=body)
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == param


async def test_valid_text_formats_are_accepted_and_echoed(fake_server: FakeServer) -> None:
    client = fake_server.client()
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}
    for fmt in (
        {"type": "json_object"},
        {"type": "json_schema", "name": "thing", "schema": schema, "strict": True},
        {"type": "text"},
    ):
        resp = await in_thread(
            client.responses.create, model="fake-model", input="echo: {}", text={"format": fmt}
        )
        assert resp.text is not None
        assert resp.text.format is not None
        assert resp.text.format.type == fmt["type"]


async def test_reasoning_items_stream_before_the_message(start_fake_server: StartServer) -> None:
    for opened, said in (
        (False, "echo: <think>plan it</think> done"),
        (True, "echo: plan it</think> done"),
    ):
        server = await start_fake_server(opens_reasoning=opened)
        events = await _raw_events(
            server.url, {"model": "fake-model", "input": said, "stream": True}
        )
        types = [name for name, _ in events]
        assert types[2] == "response.output_item.added"
        assert events[2][1]["item"]["type"] == "reasoning"  # type: ignore[index]
        deltas = [d["delta"] for n, d in events if n == "response.reasoning_text.delta"]
        assert "".join(deltas).strip() == "plan it"  # type: ignore[arg-type]
        final = events[-1][1]["response"]
        assert isinstance(final, dict)
        kinds = [item["type"] for item in final["output"]]
        assert kinds == ["reasoning", "message"]
        reasoning = final["output"][0]
        assert reasoning["summary"] == []
        assert reasoning["content"][0]["type"] == "reasoning_text"
        assert final["output"][1]["content"][0]["text"].strip() == "done"
        assert final["usage"]["output_tokens_details"]["reasoning_tokens"] > 0
        client = server.client()
        resp = await in_thread(client.responses.retrieve, final["id"])
        assert resp.output[0].type == "reasoning"


async def test_chat_template_kwargs(start_fake_server: StartServer) -> None:
    server = await start_fake_server(opens_reasoning=True)
    client = server.client()
    thinking = await in_thread(
        client.responses.create, model="fake-model", input="echo: plan</think> answer"
    )
    assert [item.type for item in thinking.output] == ["reasoning", "message"]
    plain = await in_thread(
        client.responses.create,
        model="fake-model",
        input="echo: plan</think> answer",
        extra_body={"chat_template_kwargs": {"enable_thinking": False}},
    )
    assert [item.type for item in plain.output] == ["message"]
    async with httpx.AsyncClient(timeout=30) as http:
        r = await http.post(
            f"{server.url}/v1/responses",
            json={"model": "fake-model", "input": "x", "chat_template_kwargs": {"tokenize": True}},
        )
    assert r.status_code == 400
    assert r.json()["error"]["param"] == "chat_template_kwargs"


async def test_reasoning_echo_restores_a_dropped_trace(start_fake_server: StartServer) -> None:
    server = await start_fake_server()
    client = server.client()
    first_input = [{"role": "user", "content": "echo: <think>secret plan</think> answer"}]
    first = await in_thread(
        client.responses.create, model="fake-model", input=first_input, prompt_cache_key="s1"
    )
    assert [item.type for item in first.output] == ["reasoning", "message"]
    message = first.output[1].model_dump()
    follow = [*first_input, message, {"role": "user", "content": "echo: next"}]
    without_trace = {"model": "fake-model", "input": follow, "prompt_cache_key": "s1"}
    with_trace = {
        "model": "fake-model",
        "input": [*first_input, first.output[0].model_dump(), message, follow[-1]],
        "prompt_cache_key": "s1",
    }
    async with httpx.AsyncClient(base_url=server.url, timeout=30) as http:
        restored = await http.post("/v1/responses", json=without_trace)
        sent = await http.post("/v1/responses", json=with_trace)
        other_session = await http.post(
            "/v1/responses", json={**without_trace, "prompt_cache_key": "s2"}
        )
    usage = [r.json()["usage"]["input_tokens"] for r in (restored, sent, other_session)]
    # The dropped trace is put back: the prompt is the one the client would have sent
    # with it; another session gets nothing back.
    assert usage[0] == usage[1]
    assert usage[2] < usage[0]
    async with httpx.AsyncClient(base_url=server.url, timeout=30) as http:
        counted = await http.post("/v1/responses/input_tokens", json=without_trace)
    assert counted.json()["input_tokens"] == usage[0]
