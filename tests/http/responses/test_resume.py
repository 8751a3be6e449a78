"""Resuming a background response's stream (`GET /v1/responses/{id}?stream=true`) over
real HTTP with the `openai` SDK (fake engine), on every store backend."""

from __future__ import annotations

import pytest
from resume_support import WORDS, background, events_of, frames, read_until_break, resume_to_end

from mlxcel.model.fake import FakeEngine

from support import StartServer, an_ordinary_request_completes, in_thread


@pytest.fixture(params=["memory", "sqlite", "redis"])
def fake_store(request: pytest.FixtureRequest) -> str:
    """Every test here runs on every store backend."""
    return str(request.param)


async def test_a_broken_stream_resumes_after_the_last_event_seen(
    start_fake_server: StartServer,
) -> None:
    server = await start_fake_server(FakeEngine(step_delay=0.02))
    response_id = await background(server)
    seen = await in_thread(read_until_break, server, response_id, 7)
    assert seen == list(range(8))
    numbers, final = await in_thread(resume_to_end, server, response_id, 7)
    assert numbers[0] == 8
    assert numbers == list(range(8, 8 + len(numbers)))
    retrieved = await in_thread(server.client().responses.retrieve, response_id)
    assert final.model_dump() == retrieved.model_dump()
    assert retrieved.output_text == WORDS
    # The resumed range is the same range of a full replay, byte for byte.
    full = frames(await events_of(server, response_id))
    assert frames(await events_of(server, response_id, starting_after=7)) == full[8:]
    assert b"response.created" in full[0]
    assert b"response.queued" in full[1]
    await an_ordinary_request_completes(server)
