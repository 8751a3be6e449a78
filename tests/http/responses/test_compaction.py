"""Compaction over HTTP: `/v1/responses/compact`, replay of a compaction item, and
`context_management` (fake engine; it answers a summary prompt with its default reply).
The split rules are tested in `tests/prepare/test_compaction.py`."""

from __future__ import annotations

import base64
import json
from typing import Any

import httpx
import pytest
import trio

from mlxcel.model.fake import DEFAULT_REPLY, FakeEngine

from object_fields import check_compaction
from support import (
    FakeServer,
    StartServer,
    an_ordinary_request_completes,
    count,
    in_thread,
    post,
    raw_request,
    read_until,
    wait_until,
)


def history(turns: int = 6) -> list[dict[str, Any]]:
    """`turns` long user/assistant exchanges, then a last user message."""
    items: list[dict[str, Any]] = [{"role": "developer", "content": "Answer in English."}]
    for n in range(turns):
        items.append({"role": "user", "content": f"turn {n}: " + "lorem ipsum " * 15})
        items.append({"role": "assistant", "content": f"answer {n}: " + "dolor sit " * 15})
    items.append({"role": "user", "content": "echo: And now?"})
    return items


def decode(encrypted: str) -> dict[str, Any]:
    content: dict[str, Any] = json.loads(base64.urlsafe_b64decode(encrypted + "==="))
    return content


async def test_compact_returns_kept_messages_preserved_turns_and_one_compaction(
    fake_server: FakeServer,
) -> None:
    client = fake_server.client()
    compacted = await in_thread(
        client.responses.compact,
        model="fake-model",
        input=history(),
        extra_body={"keep_tokens": 50},
    )
    assert compacted.object == "response.compaction"
    types = [item.type for item in compacted.output]
    assert types == ["message", "message", "compaction"]
    assert compacted.output[0].role == "developer"  # type: ignore[union-attr]
    assert compacted.output[1].content[0].text == "echo: And now?"  # type: ignore[union-attr]
    content = decode(compacted.output[-1].encrypted_content)  # type: ignore[union-attr]
    assert content["summary"] == DEFAULT_REPLY
    assert [p["content"][0]["text"] for p in content["preserved"]] == ["echo: And now?"]
    assert compacted.usage.output_tokens == len(DEFAULT_REPLY.split(" "))
    assert compacted.usage.input_tokens > 0
    assert compacted.model_extra is not None
    assert compacted.model_extra["model"] == "fake-model"


async def test_a_compaction_replays_in_place_of_the_history(fake_server: FakeServer) -> None:
    client = fake_server.client()
    full = history()
    compacted = await in_thread(client.responses.compact, model="fake-model", input=full)
    follow_up = [i.model_dump(exclude_none=True, warnings=False) for i in compacted.output]
    follow_up.append({"role": "user", "content": "echo: continued"})
    resp = await in_thread(client.responses.create, model="fake-model", input=follow_up)
    assert resp.output_text == "continued"
    before = await count(fake_server, {"model": "fake-model", "input": full})
    after = await count(fake_server, {"model": "fake-model", "input": follow_up})
    assert after < before / 2
    assert resp.usage is not None
    assert resp.usage.input_tokens == after
    # The compaction alone stands for the turns it preserved.
    alone = await count(fake_server, {"model": "fake-model", "input": follow_up[-2:]})
    assert alone == after - len("\x01system\x02Answer in English.")


async def test_compact_a_stored_chain(fake_server: FakeServer) -> None:
    client = fake_server.client()
    first = await in_thread(client.responses.create, model="fake-model", input=history(3))
    compacted = await in_thread(
        client.responses.compact,
        model="fake-model",
        previous_response_id=first.id,
        input="echo: next",
        instructions="keep the numbers",
    )
    assert compacted.output[-1].type == "compaction"
    content = decode(compacted.output[-1].encrypted_content)  # type: ignore[union-attr]
    assert content["preserved"][-1]["content"][0]["text"] == "echo: next"


async def test_compact_resolves_item_references(fake_server: FakeServer) -> None:
    """A history sent as references to stored items compacts like the items themselves."""
    client = fake_server.client()
    first = await in_thread(client.responses.create, model="fake-model", input=history(3))
    listed = await in_thread(client.responses.input_items.list, first.id, order="asc", limit=100)
    references = [{"type": "item_reference", "id": item.id} for item in listed.data]
    references.append({"type": "item_reference", "id": first.output[0].id})
    sent = [*references, {"role": "user", "content": "echo: next"}]
    by_reference = await in_thread(client.responses.compact, model="fake-model", input=sent)
    items = [i.model_dump(exclude_none=True, warnings=False) for i in listed.data]
    items.append(first.output[0].model_dump(exclude_none=True, warnings=False))
    by_value = await in_thread(
        client.responses.compact,
        model="fake-model",
        input=[*items, {"role": "user", "content": "echo: next"}],
    )
    assert by_reference.usage.input_tokens == by_value.usage.input_tokens
    [reference] = [decode(i.encrypted_content) for i in by_reference.output[-1:]]  # type: ignore[union-attr]
    [value] = [decode(i.encrypted_content) for i in by_value.output[-1:]]  # type: ignore[union-attr]
    texts = [[p["content"][0]["text"] for p in c["preserved"]] for c in (reference, value)]
    assert texts[0] == texts[1]  # ids aside: each request's new message gets its own
    assert texts[0][-1] == "echo: next"
    assert reference["summary"] == value["summary"]

    unknown = [{"type": "item_reference", "id": "msg_gone"}, *sent]
    r = await post(fake_server, "/v1/responses/compact", {"model": "fake-model", "input": unknown})
    assert r.status_code == 400, r.text
    assert (r.json()["error"]["param"], r.json()["error"]["code"]) == (
        "input[0].id",
        "item_not_found",
    )


@pytest.mark.parametrize(
    ("extra", "param", "code"),
    [
        ({"stream": True}, "stream", "unsupported_value"),
        ({"conversation": "conv_1"}, "conversation", "unsupported_parameter"),
        ({"keep_tokens": 0}, "keep_tokens", "invalid_value"),
        ({"max_output_tokens": 16385}, "max_output_tokens", "invalid_value"),
        ({"max_output_tokens": 0}, "max_output_tokens", "invalid_value"),
    ],
)
async def test_compact_refusals_are_400(
    fake_server: FakeServer, extra: dict[str, Any], param: str, code: str
) -> None:
    r = await post(
        fake_server, "/v1/responses/compact", {"model": "fake-model", "input": history(), **extra}
    )
    assert r.status_code == 400, r.text
    assert (r.json()["error"]["param"], r.json()["error"]["code"]) == (param, code)


SHORT = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}]
"""One tiny earlier turn: its summary (the fake engine's default reply) is longer."""


@pytest.mark.parametrize(
    ("sent", "summarised"),
    [
        pytest.param("echo: only", False, id="a string"),
        pytest.param([{"role": "user", "content": "echo: only"}], False, id="one message"),
        pytest.param(
            [
                {"role": "developer", "content": "Be brief."},
                *SHORT,
                {"role": "user", "content": "x"},
            ],
            True,
            id="a summary longer than its turns",
        ),
    ],
)
async def test_a_short_history_is_answered_as_it_is(
    fake_server: FakeServer, sent: str | list[dict[str, str]], summarised: bool
) -> None:
    client = fake_server.client()
    answer = await in_thread(
        client.responses.with_raw_response.compact, model="fake-model", input=sent
    )
    body = answer.http_response.json()
    check_compaction(body)
    messages = [{"role": "user", "content": sent}] if isinstance(sent, str) else sent
    assert [(i["type"], i["role"], i["content"][0]["text"]) for i in body["output"]] == [
        ("message", m["role"], m["content"]) for m in messages
    ]  # no compaction item: nothing was summarised
    assert (body["usage"]["total_tokens"] > 0) is summarised  # a summary tried is counted
    follow_up = [*body["output"], {"role": "user", "content": "echo: on"}]
    resp = await in_thread(client.responses.create, model="fake-model", input=follow_up)
    assert resp.output_text == "on"
    await an_ordinary_request_completes(fake_server)


async def test_a_history_beyond_the_context_window_is_still_400(
    start_fake_server: StartServer,
) -> None:
    server = await start_fake_server(context_length=256)
    r = await post(server, "/v1/responses/compact", {"model": "fake-model", "input": history()})
    assert r.status_code == 400, r.text
    assert (r.json()["error"]["type"], r.json()["error"]["code"]) == (
        "invalid_request_error",
        "context_length_exceeded",
    )
    await an_ordinary_request_completes(server)


@pytest.mark.parametrize("content", ["%%%", base64.urlsafe_b64encode(b'{"summary": 1}').decode()])
async def test_malformed_compaction_content_is_400(fake_server: FakeServer, content: str) -> None:
    item = {"type": "compaction", "encrypted_content": content}
    r = await post(
        fake_server,
        "/v1/responses",
        {"model": "fake-model", "input": [item, {"role": "user", "content": "x"}]},
    )
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"].startswith("input[0].encrypted_content")


# --- context_management --------------------------------------------------------------

MANAGED = [{"type": "compaction", "compact_threshold": 500}]


async def test_context_management_compacts_first_and_streams_its_events(
    fake_server: FakeServer,
) -> None:
    client = fake_server.client()

    def stream() -> tuple[list[Any], Any]:
        with client.responses.stream(
            model="fake-model", input=history(), extra_body={"context_management": MANAGED}
        ) as s:
            return list(s), s.get_final_response()

    events, final = await in_thread(stream)
    types = [e.type for e in events]
    assert types[:6] == [
        "response.created",
        "response.in_progress",
        "mlx.compaction.started",
        "mlx.compaction.completed",
        "response.output_item.added",
        "response.output_item.done",
    ]
    started, completed = events[2], events[3]
    assert started.model_extra["response_id"] == final.id
    before = completed.model_extra["input_tokens_before"]
    assert started.model_extra["input_tokens"] == before >= 500
    assert completed.model_extra["input_tokens_after"] < before
    assert events[4].output_index == 0
    assert events[4].item.type == "compaction"
    assert [i.type for i in final.output] == ["compaction", "message"]
    assert final.output_text == "And now?"
    assert final.usage.input_tokens == completed.model_extra["input_tokens_after"]
    assert [e.sequence_number for e in events] == list(range(len(events)))


async def test_the_summary_runs_in_the_slot_after_the_response_is_created(
    start_fake_server: StartServer,
) -> None:
    """Compaction is a phase of generation: `mlx.compaction.started` reaches the client
    before the summary is generated, keep-alives flow while it is, and the response's one
    admission covers it (a newcomer is refused, the compacting response is not)."""
    engine = FakeEngine()
    engine.hold()  # the summary runs until a progress event shows it live
    server = await start_fake_server(engine, parallel=1, max_queue_depth=0, sse_keepalive_secs=0.02)
    body = {"model": "fake-model", "input": history(), "context_management": MANAGED}
    seen: list[str] = []
    async with (
        httpx.AsyncClient(base_url=server.url, timeout=60) as http,
        http.stream("POST", "/v1/responses", json={**body, "stream": True}) as r,
    ):
        async for line in r.aiter_lines():
            if line.startswith("event: ") or line.startswith(":"):
                seen.append(line.removeprefix("event: "))
            if seen[-1:] == ["mlx.compaction.started"]:
                with trio.fail_after(10):  # the summary, in this response's slot
                    await wait_until(lambda: engine.active == 1)
                newcomer = await http.post(
                    "/v1/responses", json={"model": "fake-model", "input": "hi"}
                )
                assert newcomer.status_code == 503
            if "mlx.compaction.started" in seen and seen[-1] == "mlx.progress":
                engine.release()
    started = seen.index("mlx.compaction.started")
    completed = seen.index("mlx.compaction.completed")
    assert seen[:started] == ["response.created", "response.in_progress"]
    assert "mlx.progress" in seen[started:completed]  # the summary took its time, live
    assert seen[-1] == "response.completed"


@pytest.mark.parametrize("leave", ["hang up", "cancel"])
async def test_leaving_during_the_summary_frees_the_slot_and_keeps_the_response(
    start_fake_server: StartServer, leave: str
) -> None:
    """A client that hangs up, or cancels, while its response's summary is generated:
    the summary stops, the slot is free, and the response is stored `cancelled`."""
    engine = FakeEngine()
    engine.hold()  # the summary runs until the client leaves
    server = await start_fake_server(engine, parallel=1, max_queue_depth=0)
    body = {"model": "fake-model", "input": history(), "context_management": MANAGED}
    stream = await raw_request(server.url, {**body, "stream": True})
    seen = await read_until(stream, b"event: mlx.compaction.started")
    response_id = seen.split(b'"id":"', 1)[1].split(b'"', 1)[0].decode()
    async with httpx.AsyncClient(base_url=server.url, timeout=60) as http:
        with trio.fail_after(10):  # the summary is being generated
            await wait_until(lambda: engine.active == 1)
        if leave == "cancel":
            cancelled = await http.post(f"/v1/responses/{response_id}/cancel")
            assert cancelled.json()["status"] == "cancelled"
        await stream.aclose()
        with trio.fail_after(10):
            await wait_until(lambda: engine.active == 0)
            while (r := await http.get(f"/v1/responses/{response_id}")).status_code == 404:  # noqa: ASYNC110 - polled over HTTP
                await trio.sleep(0.01)
        assert r.json()["status"] == "cancelled"
        assert (await http.get("/health")).json()["slots"]["busy"] == 0
        engine.release()
        ordinary = await http.post("/v1/responses", json={"model": "fake-model", "input": "hi"})
        assert ordinary.status_code == 200
        assert ordinary.json()["status"] == "completed"


async def test_a_chained_follow_up_replays_the_summary_without_compacting_again(
    fake_server: FakeServer,
) -> None:
    client = fake_server.client()
    first = await in_thread(
        client.responses.create,
        model="fake-model",
        input=history(),
        extra_body={"context_management": MANAGED},
    )
    assert first.output[0].type == "compaction"
    second = await in_thread(
        client.responses.create,
        model="fake-model",
        previous_response_id=first.id,
        input="echo: again",
        extra_body={"context_management": MANAGED},
    )
    assert [i.type for i in second.output] == ["message"]
    assert second.output_text == "again"
    assert second.usage is not None
    assert second.usage.input_tokens < 500


async def test_below_the_threshold_nothing_is_compacted(fake_server: FakeServer) -> None:
    client = fake_server.client()
    resp = await in_thread(
        client.responses.create,
        model="fake-model",
        input="echo: short",
        extra_body={"context_management": MANAGED},
    )
    assert [i.type for i in resp.output] == ["message"]


async def test_context_management_failure_is_an_http_error(fake_server: FakeServer) -> None:
    body = {
        "model": "fake-model",
        "input": "echo: " + "long " * 200,  # over the threshold, but nothing to summarise
        "context_management": MANAGED,
    }
    for stream in (False, True):
        r = await post(fake_server, "/v1/responses", {**body, "stream": stream})
        assert r.status_code == 400, r.text
        assert r.json()["error"]["code"] == "context_length_exceeded"


@pytest.mark.parametrize("threshold", [0, 100_000_001])
async def test_bad_thresholds_are_400(fake_server: FakeServer, threshold: int) -> None:
    r = await post(
        fake_server,
        "/v1/responses",
        {
            "model": "fake-model",
            "input": "x",
            "context_management": [{"type": "compaction", "compact_threshold": threshold}],
        },
    )
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == "context_management[0].compact_threshold"


async def test_background_jobs_compact_or_fail_with_invalid_prompt(
    start_fake_server: StartServer,
) -> None:
    server = await start_fake_server()
    client = server.client()
    done = await in_thread(
        client.responses.create,
        model="fake-model",
        input=history(),
        background=True,
        extra_body={"context_management": MANAGED},
    )
    failed = await in_thread(
        client.responses.create,
        model="fake-model",
        input="echo: " + "long " * 200,
        background=True,
        extra_body={"context_management": MANAGED},
    )
    for _ in range(200):
        done = await in_thread(client.responses.retrieve, done.id)
        failed = await in_thread(client.responses.retrieve, failed.id)
        if done.status not in ("queued", "in_progress") and failed.status == "failed":
            break
        await trio.sleep(0.05)
    assert done.status == "completed"
    assert [i.type for i in done.output] == ["compaction", "message"]
    assert failed.status == "failed"
    assert failed.error is not None
    assert failed.error.code == "invalid_prompt"
