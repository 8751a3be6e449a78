"""End to end on the real model: `/v1/responses/compact` and `context_management`."""

from __future__ import annotations

import base64
import json
from typing import Any

import pytest

from server_process import RealServer

pytestmark = pytest.mark.e2e

TOPICS = ["the parser", "the cache", "the scheduler", "the store", "the docs", "the bench"]


def six_turns() -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = [{"role": "system", "content": "You are a coding assistant."}]
    for n, topic in enumerate(TOPICS):
        items.append({"role": "user", "content": f"Step {n}: review {topic} in src/{n}.py. " * 6})
        items.append({"role": "assistant", "content": f"Reviewed {topic}: it needs tests. " * 6})
    items.append({"role": "user", "content": "Which file did we review first?"})
    return items


def test_compact_then_continue_from_the_compaction(real_server: RealServer) -> None:
    client = real_server.client()
    model = real_server.alias
    history = six_turns()
    compacted = client.responses.compact(
        model=model, input=history, extra_body={"max_output_tokens": 48, "keep_tokens": 64}
    )
    assert compacted.object == "response.compaction"
    assert [item.type for item in compacted.output] == ["message", "message", "compaction"]
    encrypted = compacted.output[-1].encrypted_content  # type: ignore[union-attr]
    content = json.loads(base64.urlsafe_b64decode(encrypted + "=" * (-len(encrypted) % 4)))
    assert content["summary"].strip()
    assert content["preserved"][-1]["content"][0]["text"] == history[-1]["content"]
    assert 0 < compacted.usage.output_tokens <= 48

    follow_up = [i.model_dump(exclude_none=True, warnings=False) for i in compacted.output]
    follow_up.append({"role": "user", "content": "Reply with one word: done"})
    full = client.responses.input_tokens.count(model=model, input=history).input_tokens
    short = client.responses.input_tokens.count(model=model, input=follow_up).input_tokens
    assert short < full
    reply = client.responses.create(
        model=model, input=follow_up, max_output_tokens=8, temperature=0
    )
    assert reply.output_text.strip()
    assert reply.usage is not None
    assert reply.usage.input_tokens == short


def test_context_management_streams_compaction_then_chains_without_it(
    real_server: RealServer,
) -> None:
    client = real_server.client()
    model = real_server.alias
    managed = [{"type": "compaction", "compact_threshold": 400}]
    with client.responses.stream(
        model=model,
        input=six_turns(),
        max_output_tokens=8,
        temperature=0,
        extra_body={"context_management": managed},
    ) as stream:
        # Progress events come whenever the stream is quiet (the summary takes a while).
        events = [e for e in stream if e.type != "mlx.progress"]
    final = events[-1].response  # completed, or incomplete at 8 tokens
    assert final.status in ("completed", "incomplete")
    types = [e.type for e in events]
    assert types[:6] == [
        "response.created",
        "response.in_progress",
        "mlx.compaction.started",
        "mlx.compaction.completed",
        "response.output_item.added",
        "response.output_item.done",
    ]
    completed = events[3].model_extra or {}
    assert completed["input_tokens_after"] < completed["input_tokens_before"]
    assert [item.type for item in final.output][:1] == ["compaction"]
    assert final.output[0].id == events[4].item.id  # type: ignore[union-attr]

    chained = client.responses.create(
        model=model,
        previous_response_id=final.id,
        input="Thanks.",
        max_output_tokens=8,
        temperature=0,
        extra_body={"context_management": managed},
    )
    assert chained.output[0].type != "compaction"
    assert chained.usage is not None
    assert chained.usage.input_tokens < 400
