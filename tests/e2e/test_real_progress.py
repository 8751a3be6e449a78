"""End to end on the real model: `mlx.progress` while a long prompt is read."""

from __future__ import annotations

import uuid

import pytest

from server_process import RealServer

pytestmark = pytest.mark.e2e


def test_a_long_prompt_reports_its_reading(progress_server: RealServer) -> None:
    client = progress_server.client()
    # A fresh first line: nothing of this prompt is in the prompt cache. It is longer
    # than one step reads (512 tokens), so reading it takes several steps.
    prompt = f"{uuid.uuid4()}\nCount the cats.\n" + "The cat sat on the mat. " * 200
    with client.responses.stream(
        model=progress_server.alias, input=prompt, max_output_tokens=4, temperature=0
    ) as stream:
        events = list(stream)
    final = events[-1]
    assert final.type in ("response.completed", "response.incomplete")  # 4 tokens: cut short
    assert [e.sequence_number for e in events] == list(range(len(events)))
    progress = [e.model_extra or {} for e in events if e.type == "mlx.progress"]
    assert len(progress) >= 2, [e.type for e in events]
    assert final.response.usage is not None
    total = final.response.usage.input_tokens
    assert {p["prompt_tokens_total"] for p in progress} == {total}
    assert {p["queue_position"] for p in progress} == {None}
    read = [p["prompt_tokens_read"] for p in progress]
    assert read == sorted(read)
    assert 0 < read[-1] <= total
