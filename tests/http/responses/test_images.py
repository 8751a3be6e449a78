"""`input_image` parts for a model without vision, under `--images placeholder|reject`,
over real HTTP with the `openai` SDK on the fake engine."""

from __future__ import annotations

import base64
import logging
from typing import Any

import httpx
import openai
import pytest

from mlxcel.items import IMAGE_PLACEHOLDER

from support import FakeServer, StartServer, in_thread

PNG = "data:image/png;base64," + base64.b64encode(b"\x89PNG\r\n\x1a\n" + b"\0" * 64).decode()


def look(*parts: dict[str, Any]) -> list[dict[str, Any]]:
    return [{"role": "user", "content": [{"type": "input_text", "text": "Look:"}, *parts]}]


async def post(server: FakeServer, body: dict[str, Any]) -> httpx.Response:
    async with httpx.AsyncClient(timeout=120) as http:
        return await http.post(f"{server.url}/v1/responses", json={"model": "fake-model", **body})


async def test_an_image_reads_as_a_placeholder_and_is_kept_as_sent(
    fake_server: FakeServer, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="mlxcel.prepare.policy")
    client = fake_server.client()
    resp = await in_thread(
        client.responses.create,
        model="fake-model",
        input=look({"type": "input_image", "image_url": PNG, "detail": "low"}),  # type: ignore[arg-type]
    )
    assert resp.status == "completed"
    assert f"\x01user\x02Look:\n{IMAGE_PLACEHOLDER}" in fake_server.engine.prompts[-1]
    assert PNG not in fake_server.engine.prompts[-1]
    assert "cannot see" in caplog.text
    items = await in_thread(client.responses.input_items.list, resp.id)
    image = items.data[0].content[1]  # type: ignore[union-attr]
    assert image.type == "input_image"
    assert (image.image_url, image.detail) == (PNG, "low")  # type: ignore[union-attr]


async def test_images_by_file_id_and_a_follow_up_turn(fake_server: FakeServer) -> None:
    client = fake_server.client()
    first = await in_thread(
        client.responses.create,
        model="fake-model",
        input=look({"type": "input_image", "file_id": "file_1", "detail": "auto"}),  # type: ignore[arg-type]
    )
    follow = await in_thread(
        client.responses.create,
        model="fake-model",
        previous_response_id=first.id,
        input="echo: and now?",
    )
    assert follow.output_text == "and now?"
    assert IMAGE_PLACEHOLDER in fake_server.engine.prompts[-1]  # the history renders too


async def test_reject_answers_400_naming_the_flag(start_fake_server: StartServer) -> None:
    server = await start_fake_server(images="reject")
    client = server.client()
    with pytest.raises(openai.BadRequestError) as caught:
        await in_thread(
            client.responses.create,
            model="fake-model",
            input=look({"type": "input_image", "image_url": PNG, "detail": "auto"}),  # type: ignore[arg-type]
        )
    body = caught.value.body
    assert isinstance(body, dict)
    assert "--images placeholder" in body["message"]
    assert "cannot see images" in body["message"]
    assert body["param"] == "input"
    assert not server.engine.prompts  # nothing reached the model
    plain = await in_thread(client.responses.create, model="fake-model", input="echo: words")
    assert plain.output_text == "words"


@pytest.mark.parametrize("kind", ["function", "custom"])
async def test_an_image_in_a_call_output(fake_server: FakeServer, kind: str) -> None:
    """Codex's view_image answers a call with an image; a custom tool's output may too."""
    client = fake_server.client()
    tool: dict[str, Any] = {"type": kind, "name": "view_image"}
    call: dict[str, Any] = {"type": f"{kind}_call", "call_id": "c1", "name": "view_image"}
    if kind == "function":
        tool["parameters"] = {"type": "object"}
        call["arguments"] = "{}"
    else:
        call = {**call, "type": "custom_tool_call", "input": "screen"}
    output = [
        {"type": "input_text", "text": "the screenshot:"},
        {"type": "input_image", "image_url": PNG},
    ]
    resp = await in_thread(
        client.responses.create,
        model="fake-model",
        tools=[tool],
        input=[
            {"role": "user", "content": "show me"},
            call,
            {"type": f"{call['type']}_output", "call_id": "c1", "output": output},
        ],
    )
    assert resp.status == "completed"
    assert f"\x01tool\x02the screenshot:\n{IMAGE_PLACEHOLDER}" in fake_server.engine.prompts[-1]
    items = await in_thread(client.responses.input_items.list, resp.id, order="asc")
    sent = items.data[2]
    assert sent.type == f"{call['type']}_output"
    assert [p.type for p in sent.output] == ["input_text", "input_image"]  # type: ignore[union-attr]
    assert sent.output[1].image_url == PNG  # type: ignore[union-attr]


async def test_a_giant_data_url_within_the_body_limit(fake_server: FakeServer) -> None:
    giant = "data:image/png;base64," + "A" * (8 * 1024 * 1024)
    r = await post(
        fake_server, {"input": look({"type": "input_image", "image_url": giant}), "store": False}
    )
    assert r.status_code == 200, r.text[:300]
    assert len(fake_server.engine.prompts[-1]) < 1000  # the model reads the note, not the data


@pytest.mark.parametrize(
    "part",
    [
        {"type": "input_image"},
        {"type": "input_image", "image_url": 5},
        {"type": "input_image", "image_url": PNG, "detail": "ultra"},
        {"type": "input_image", "file_id": ["f"]},
        {"type": "input_file", "file_id": "file_1"},
    ],
    ids=["neither-url-nor-file", "number-url", "bad-detail", "list-file-id", "file"],
)
async def test_bad_image_parts_are_400(fake_server: FakeServer, part: dict[str, Any]) -> None:
    r = await post(fake_server, {"input": look(part)})
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"].startswith("input[0]")


async def test_an_image_alone_is_not_a_message(fake_server: FakeServer) -> None:
    r = await post(fake_server, {"input": [{"type": "input_image", "image_url": PNG}]})
    assert r.status_code == 400, r.text


async def test_input_tokens_count_the_placeholder(fake_server: FakeServer) -> None:
    async with httpx.AsyncClient(timeout=30) as http:
        r = await http.post(
            f"{fake_server.url}/v1/responses/input_tokens",
            json={"input": look({"type": "input_image", "image_url": "x" * 100_000})},
        )
    assert r.status_code == 200, r.text
    assert r.json()["input_tokens"] < 200  # one token per character in the fake


async def test_a_conversation_keeps_images_and_its_turns_read_the_note(
    fake_server: FakeServer,
) -> None:
    client = fake_server.client()
    conv = await in_thread(
        client.conversations.create,
        items=look({"type": "input_image", "image_url": PNG, "detail": "high"}),  # type: ignore[arg-type]
    )
    listed = await in_thread(client.conversations.items.list, conv.id)
    assert listed.data[0].content[1].image_url == PNG  # type: ignore[union-attr]
    resp = await in_thread(
        client.responses.create, model="fake-model", conversation=conv.id, input="echo: seen"
    )
    assert resp.output_text == "seen"
    assert IMAGE_PLACEHOLDER in fake_server.engine.prompts[-1]
