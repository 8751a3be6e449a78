"""End to end on the real model: a storm of background jobs, the cap, and cancel."""

from __future__ import annotations

import time

import openai
import pytest
from openai.types.responses import Response

from server_process import RealServer

pytestmark = pytest.mark.e2e

TERMINAL = ("completed", "incomplete", "failed", "cancelled")


def wait_terminal(client: openai.OpenAI, ids: list[str], timeout: float) -> dict[str, Response]:
    done: dict[str, Response] = {}
    deadline = time.monotonic() + timeout
    while len(done) < len(ids):
        assert time.monotonic() < deadline, f"stuck: {sorted(set(ids) - set(done))[:5]}"
        for response_id in ids:
            if response_id not in done:
                resp = client.responses.retrieve(response_id)
                if resp.status in TERMINAL:
                    done[response_id] = resp
        time.sleep(0.5)
    return done


def test_64_jobs_all_finish_and_the_65th_gets_429(real_server: RealServer) -> None:
    client = real_server.client()
    ids = []
    for i in range(64):
        job = client.responses.create(
            model=real_server.alias,
            input=f"Say the number {i}.",
            max_output_tokens=6,
            temperature=0,
            background=True,
        )
        assert job.status in ("queued", "in_progress")
        assert job.background is True
        ids.append(job.id)
    with pytest.raises(openai.RateLimitError) as refused:
        client.responses.create(
            model=real_server.alias, input="One too many.", max_output_tokens=6, background=True
        )
    assert refused.value.body["code"] == "rate_limit_exceeded"  # type: ignore[index]
    finals = wait_terminal(client, ids, timeout=900)
    for response_id in ids:
        final = finals[response_id]
        assert final.status in ("completed", "incomplete"), final.error
        assert final.output_text.strip()
        assert final.usage is not None
        assert final.usage.output_tokens > 0


def test_cancelled_job_stays_cancelled_and_frees_its_slot(one_slot_server: RealServer) -> None:
    client = one_slot_server.client()
    alias = one_slot_server.alias
    long_job = client.responses.create(
        model=alias, input="Count from 1 to 1000.", max_output_tokens=2000, background=True
    )
    deadline = time.monotonic() + 120
    while client.responses.retrieve(long_job.id).status != "in_progress":
        assert time.monotonic() < deadline
        time.sleep(0.2)
    cancelled = client.responses.cancel(long_job.id)
    assert cancelled.status == "cancelled"
    quick = client.responses.create(
        model=alias, input="Say ok.", max_output_tokens=4, background=True
    )
    final = wait_terminal(client, [quick.id], timeout=120)[quick.id]
    assert final.status in ("completed", "incomplete")
    assert client.responses.retrieve(long_job.id).status == "cancelled"
