"""End to end on the real model: what real clients send by default, hosted tools,
images and item references, answered rather than refused."""

from __future__ import annotations

import base64

import pytest

from server_process import RealServer

pytestmark = pytest.mark.e2e

PNG = "data:image/png;base64," + base64.b64encode(b"\x89PNG\r\n\x1a\n" + b"\0" * 32).decode()


def test_web_search_is_ignored_and_an_image_reads_as_a_note(lenient_server: RealServer) -> None:
    client = lenient_server.client()
    resp = client.responses.create(
        model=lenient_server.alias,
        input=[
            {
                "role": "user",
                "content": [
                    {"type": "input_text", "text": "Say hello."},
                    {"type": "input_image", "image_url": PNG, "detail": "auto"},
                ],
            }
        ],
        tools=[{"type": "web_search"}],
        temperature=0,
        max_output_tokens=4,
    )
    assert resp.status in ("completed", "incomplete")
    assert resp.output_text.strip()
    assert "web_search" in lenient_server.log.read_text()  # logged as ignored
    # The turn goes on by reference: the stored question and answer named by id (the
    # prompt starts as the first one did, so the prompt cache spares its prefill).
    listed = client.responses.input_items.list(resp.id)
    assert listed.data[0].content[1].type == "input_image"  # type: ignore[union-attr]
    follow = client.responses.create(
        model=lenient_server.alias,
        input=[
            {"type": "item_reference", "id": listed.data[0].id},  # type: ignore[typeddict-item]
            {"type": "item_reference", "id": resp.output[0].id},  # type: ignore[typeddict-item]
            {"role": "user", "content": "Again."},
        ],
        tools=[{"type": "web_search"}],
        temperature=0,
        max_output_tokens=4,
    )
    assert follow.output_text.strip()
    assert follow.usage is not None
    assert follow.usage.input_tokens_details.cached_tokens > 0
