"""The step policy: prefill chunks within the budget, and the budget from step costs."""

from __future__ import annotations

import random

import pytest

from mlxcel.model.step_cost import StepCost
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


def steps(budget: StepBudget, fixed: float, per_row: float, per_token: float) -> None:
    """Feed `budget` the steps of a machine whose cost is exactly that line (ms)."""
    for rows, tokens in ((8, 0), (16, 0), (32, 0), (64, 0), (0, 500), (16, 64), (64, 32)):
        budget.observe(rows, tokens, (fixed + per_row * rows + per_token * tokens) / 1000)


def test_with_nothing_decoding_the_budget_is_the_cap() -> None:
    budget = StepBudget(cap=512, full_batch=64)
    assert budget.tokens(0) == 512
    budget.observe(8, 0, 0.4)
    assert budget.tokens(0) == 512


def test_before_any_measurement_the_budget_is_the_cap() -> None:
    assert StepBudget(cap=300, full_batch=4).tokens(3) == 300


def test_the_budget_fills_a_step_of_a_full_batch_decode_and_a_half() -> None:
    budget = StepBudget(cap=4096, full_batch=64)
    steps(budget, fixed=180, per_row=17, per_token=5)
    full = 180 + 17 * 64
    assert budget.step_ms(64) == pytest.approx(1.5 * full, rel=0.01)
    # At 64 rows: the step may last 1.5 x the full decode step, which it already pays.
    assert budget.tokens(64) == pytest.approx(0.5 * full / 5, rel=0.02)
    # With fewer rows decoding, more of the step is left for prompts.
    assert budget.tokens(8) > budget.tokens(32) > budget.tokens(64)


def test_a_forward_of_its_own_pays_the_fixed_part_again() -> None:
    budget = StepBudget(cap=4096, full_batch=64)
    steps(budget, fixed=180, per_row=17, per_token=5)
    shared, alone = budget.tokens(16), budget.tokens(16, separate=True)
    assert shared - alone == pytest.approx(180 / 5, abs=2)


def test_a_fixed_step_length_overrides_the_estimate() -> None:
    budget = StepBudget(cap=4096, full_batch=64, max_step_ms=600)
    steps(budget, fixed=100, per_row=25, per_token=10)
    assert budget.tokens(16) == 16  # (600 - 500) / 10 = 10, raised to the floor
    budget.max_step_ms = 1500
    assert budget.tokens(16) == pytest.approx(100, abs=1)


def test_the_budget_never_falls_below_the_floor_nor_above_the_cap() -> None:
    budget = StepBudget(cap=256, full_batch=64, max_step_ms=200)
    steps(budget, fixed=100, per_row=50, per_token=5)  # decoding alone overruns the step
    assert budget.tokens(4) == MIN_PREFILL_TOKENS
    cheap = StepBudget(cap=256, full_batch=64)
    steps(cheap, fixed=100, per_row=50, per_token=0.001)
    assert cheap.tokens(1) == 256


def test_the_step_is_sized_for_the_batch_being_built_not_the_slots() -> None:
    budget = StepBudget(cap=4096, full_batch=64)
    steps(budget, fixed=180, per_row=17, per_token=5)
    # 12 streams decode and 4 prompts wait: the step is 1.5 x a 16-row decode, not a 64-row one.
    assert budget.step_ms(16) == pytest.approx(1.5 * (180 + 17 * 16), rel=0.02)
    assert budget.tokens(12, 16) < budget.tokens(12) / 3
    assert budget.tokens(12, 200) == budget.tokens(12)  # never beyond the slots


def test_a_chunk_deep_in_a_long_prompt_gets_fewer_tokens_in_the_same_step() -> None:
    budget = StepBudget(cap=4096, full_batch=64)
    cost = StepCost(fixed=100.0, per_row=4.0, per_token=2.0, per_kscore=0.3)
    for rows, tokens, offset in (
        (16, 0, 0),
        (32, 0, 0),
        (16, 128, 0),
        (16, 256, 3000),
        (0, 512, 0),
    ):
        kscores = (rows * 300 + tokens * offset + tokens * tokens / 2) / 1000
        budget.observe(rows, tokens, cost.ms(rows, tokens, kscores) / 1000, int(kscores * 1000))
    step = budget.step_ms(16, context=300)
    assert step is not None
    shallow = budget.tokens(16, 16, context=300, offset=0)
    deep = budget.tokens(16, 16, context=300, offset=6000)
    assert deep < 0.6 * shallow
    for offset, tokens in ((0, shallow), (6000, deep)):  # each fills the step, no more
        kscores = (16 * 300 + tokens * offset + tokens * tokens / 2) / 1000
        assert cost.ms(16, tokens, kscores) == pytest.approx(step, rel=0.02)
