"""The step policy: prefill chunks within the budget, and the budget from step costs."""

from __future__ import annotations

import random

import pytest

from mlxcel.model.step_plan import (
    MAX_PADDING,
    MIN_PREFILL_TOKENS,
    Chunk,
    StepBudget,
    Waiting,
    plan_chunk,
)


def waiting(*remaining: int) -> list[Waiting]:
    return [Waiting(key, r) for key, r in enumerate(remaining)]


def test_nothing_to_read_or_no_budget_plans_nothing() -> None:
    assert plan_chunk([], 512) is None
    assert plan_chunk(waiting(10), 0) is None


def test_a_long_prompt_is_read_alone_in_budget_sized_chunks() -> None:
    chunk = plan_chunk(waiting(5000, 60, 60), 256)
    assert chunk == Chunk((0,), (256,), 256)


def test_prompts_of_similar_length_share_a_chunk_and_all_finish() -> None:
    chunk = plan_chunk(waiting(60, 64, 57, 61), 512)
    assert chunk is not None
    assert chunk.keys == (0, 1, 2, 3)
    assert chunk.length == 64  # stretched to the longest, the others padded
    assert chunk.reads == (60, 64, 57, 61)


def test_the_budget_bounds_how_many_prompts_join() -> None:
    chunk = plan_chunk(waiting(60, 64, 57, 61), 165)
    assert chunk is not None
    assert chunk.keys == (0, 1)
    assert chunk.tokens <= 165


def test_a_much_shorter_prompt_is_not_padded_into_a_long_chunk() -> None:
    chunk = plan_chunk(waiting(200, 10, 190), 1000)
    assert chunk is not None
    assert 1 not in chunk.keys  # 190 of its 200 tokens would be padding
    assert chunk.keys == (0, 2)


def test_the_oldest_prompt_always_takes_part() -> None:
    chunk = plan_chunk(waiting(3, 300, 300), 600)
    assert chunk is not None
    assert chunk.keys[0] == 0
    assert chunk.reads[0] == 3


@pytest.mark.parametrize("seed", range(20))
def test_random_queues_stay_within_budget_padding_and_rows(seed: int) -> None:
    rng = random.Random(seed)
    queue = waiting(*(rng.choice([1, 5, 60, 120, 700, 3000]) for _ in range(rng.randint(1, 40))))
    budget = rng.choice([16, 100, 256, 512, 2048])
    chunk = plan_chunk(queue, budget, max_rows=8)
    assert chunk is not None
    assert chunk.tokens <= budget
    assert len(chunk.keys) <= 8
    assert chunk.keys[0] == 0
    by_key = {w.key: w.remaining for w in queue}
    for key, read in zip(chunk.keys, chunk.reads, strict=True):
        assert read == min(by_key[key], chunk.length)
    padding = sum(chunk.length - read for read in chunk.reads)
    assert padding <= MAX_PADDING * chunk.tokens
    assert list(chunk.keys) == sorted(chunk.keys)  # in queue order


def test_with_nothing_decoding_the_budget_is_the_cap() -> None:
    budget = StepBudget(cap=512, full_batch=64)
    assert budget.tokens(0) == 512
    budget.observe_decode(8, 0.4)
    assert budget.tokens(0) == 512


def test_before_any_measurement_the_budget_is_the_cap() -> None:
    assert StepBudget(cap=300, full_batch=4).tokens(3) == 300


def test_the_budget_fills_a_step_of_a_full_batch_decode_and_a_half() -> None:
    budget = StepBudget(cap=4096, full_batch=64)
    for rows, ms in ((8, 378), (16, 506), (32, 762), (64, 1274)):
        budget.observe_decode(rows, ms / 1000)
    budget.observe_prefill(500, 500 * 0.0077)
    assert budget.estimate_decode_ms(64) == pytest.approx(1274, rel=0.02)

    # At 64 rows: the step may last 1.5 x 1274 ms, of which decoding took 1274.
    assert budget.tokens(64) == pytest.approx(0.5 * 1274 / 7.7, rel=0.05)
    # With fewer rows decoding, more of the step is left for prompts.
    assert budget.tokens(8) > budget.tokens(32) > budget.tokens(64)


def test_a_fixed_step_length_overrides_the_estimate() -> None:
    budget = StepBudget(cap=4096, full_batch=64, max_step_ms=600)
    budget.observe_decode(16, 0.5)
    budget.observe_prefill(100, 1.0)  # 10 ms a token
    assert budget.tokens(16) == 16  # (600 - 500) / 10 = 10, raised to the floor
    budget.max_step_ms = 1500
    assert budget.tokens(16) == 100


def test_the_budget_never_falls_below_the_floor_nor_above_the_cap() -> None:
    budget = StepBudget(cap=256, full_batch=4)
    budget.observe_decode(4, 5.0)
    budget.observe_prefill(64, 64.0)  # a second a token
    assert budget.tokens(4) == MIN_PREFILL_TOKENS
    cheap = StepBudget(cap=256, full_batch=4)
    cheap.observe_decode(4, 5.0)
    cheap.observe_prefill(10_000, 0.001)
    assert cheap.tokens(1) == 256


def test_small_chunks_do_not_skew_the_per_token_cost() -> None:
    budget = StepBudget(cap=1024, full_batch=8)
    budget.observe_prefill(256, 256 * 0.008)
    budget.observe_prefill(MIN_PREFILL_TOKENS, 0.3)  # mostly a forward's fixed cost
    assert budget.prefill_ms_per_token == pytest.approx(8.0)


def test_the_full_batch_estimate_rises_at_least_by_the_prefill_cost_per_row() -> None:
    budget = StepBudget(cap=4096, full_batch=64)
    budget.observe_decode(8, 0.378)  # one batch size seen: nothing to fit a slope to
    assert budget.estimate_decode_ms(64) == pytest.approx(378)
    budget.observe_prefill(400, 400 * 0.0077)
    assert budget.estimate_decode_ms(64) == pytest.approx(378 + 56 * 7.7)
    # So a burst that has only reached 8 rows still reads prompts at a good pace (the
    # flat estimate would allow 0.5 x 378 / 7.7 = 24 tokens a step).
    assert budget.tokens(8) > 100


def test_the_step_is_sized_for_the_batch_being_built_not_the_slots() -> None:
    budget = StepBudget(cap=4096, full_batch=64)
    for rows, ms in ((4, 314), (16, 506), (64, 1274)):
        budget.observe_decode(rows, ms / 1000)
    budget.observe_prefill(500, 500 * 0.0077)
    # 12 streams decode and 4 prompts wait: the step is 1.5 x a 16-row decode, not a 64-row one.
    assert budget.step_ms(16) == pytest.approx(1.5 * 506, rel=0.1)
    assert budget.tokens(12, 16) < budget.tokens(12) / 3
    assert budget.tokens(12, 200) == budget.tokens(12)  # never beyond the slots
