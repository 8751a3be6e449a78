"""End to end on the real model: `/metrics` sees the tokens, the prompt cache and the
engine's steps of real requests."""

from __future__ import annotations

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from server_process import RealServer

pytestmark = pytest.mark.e2e


def scrape(server: RealServer) -> dict[str, float]:
    """The server-wide value of each series by name (unlabelled, or over every model)."""
    r = httpx.get(f"{server.url}/metrics", timeout=30)
    assert r.status_code == 200, r.text
    values: dict[str, float] = {}
    for family in text_string_to_metric_families(r.text):
        for sample in family.samples:
            if set(sample.labels) <= {"model"}:  # a generation series: added up over models
                values[sample.name] = values.get(sample.name, 0.0) + sample.value
    return values


def test_a_real_request_moves_tokens_cache_hits_and_engine_steps(real_server: RealServer) -> None:
    client = real_server.client()
    before = scrape(real_server)
    usages = []
    for _ in range(2):  # the second reads most of its prompt from the prompt cache
        reply = client.responses.create(
            model=real_server.alias,
            input="Name one colour.",
            max_output_tokens=4,
            temperature=0,
            store=False,
        )
        assert reply.usage is not None
        usages.append(reply.usage)
    after = scrape(real_server)

    def moved(name: str) -> float:
        return after[name] - before[name]

    assert moved("mlxcel_prompt_tokens_total") >= sum(u.input_tokens for u in usages) > 0
    assert moved("mlxcel_output_tokens_total") >= sum(u.output_tokens for u in usages) > 0
    cached = usages[1].input_tokens_details.cached_tokens
    assert cached > 0
    assert moved("mlxcel_prompt_cache_hit_tokens_total") >= cached
    # Prefill and every decode step ran on the model thread, each one timed.
    assert moved("mlxcel_engine_step_seconds_count") >= sum(u.output_tokens for u in usages)
    assert moved("mlxcel_engine_step_seconds_sum") > 0
    assert moved("mlxcel_time_to_first_token_seconds_count") >= 2
    assert after["mlxcel_slots"] == 16
