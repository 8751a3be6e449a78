"""The step cost fit: `fixed + per_row · rows + per_token · tokens + per_kscore · kscores`,
from measured steps."""

from __future__ import annotations

import random

import pytest

from mlxcel.model.step_cost import WINDOW, Sample, StepCost, StepCostModel, fit


def line(
    cost: StepCost, shapes: list[tuple[int, int]], noise: float = 0.0, seed: int = 0
) -> list[Sample]:
    rng = random.Random(seed)
    return [(r, t, 0.0, cost.ms(r, t) * (1 + rng.uniform(-noise, noise))) for r, t in shapes]


MIXED = [(16, 0), (16, 48), (64, 0), (64, 16), (0, 512), (1, 0), (8, 200), (32, 32)]


def test_an_exact_line_is_recovered() -> None:
    truth = StepCost(fixed=40.0, per_row=3.0, per_token=1.5)
    got = fit(line(truth, MIXED))
    assert got.fixed == pytest.approx(40.0, rel=1e-6)
    assert got.per_row == pytest.approx(3.0, rel=1e-6)
    assert got.per_token == pytest.approx(1.5, rel=1e-6)


@pytest.mark.parametrize("seed", range(10))
def test_noisy_steps_give_a_close_line(seed: int) -> None:
    truth = StepCost(fixed=180.0, per_row=17.0, per_token=5.0)
    rng = random.Random(seed)
    shapes = [(rng.choice([1, 4, 16, 64]), rng.choice([0, 0, 16, 64, 256])) for _ in range(WINDOW)]
    got = fit(line(truth, shapes, noise=0.05, seed=seed))
    for rows, tokens in ((1, 0), (64, 0), (16, 256), (0, 1024)):
        assert got.ms(rows, tokens) == pytest.approx(truth.ms(rows, tokens), rel=0.1)


def test_the_fixed_part_is_not_taken_for_a_per_token_cost() -> None:
    # What the old per-token average did: 180 ms + 16 tokens x 5 ms read as 16 ms a token.
    truth = StepCost(fixed=180.0, per_row=17.0, per_token=5.0)
    got = fit(line(truth, [(0, 16), (0, 32), (0, 64), (0, 256), (8, 0), (16, 0)]))
    assert got.per_token == pytest.approx(5.0, rel=1e-3)


def test_no_part_is_negative_and_a_row_costs_at_least_a_token() -> None:
    # Decode steps that got cheaper with more rows (a noisy machine) and dear prompts.
    got = fit([(4, 0, 0, 300.0), (16, 0, 0, 200.0), (0, 100, 0, 900.0), (0, 300, 0, 2500.0)])
    assert min(got.fixed, got.per_row, got.per_token) >= 0
    assert got.per_row >= got.per_token


def test_decode_steps_of_one_size_still_give_a_usable_line() -> None:
    got = fit([(16, 0, 0, 400.0)] * 5)
    assert got.ms(16) == pytest.approx(400.0, rel=1e-6)  # what was seen is what is predicted
    assert got.per_token > 0  # before any prompt: a guess, not free
    assert got.per_row >= got.per_token


def test_the_model_forgets_old_steps_and_follows_a_change() -> None:
    model = StepCostModel()
    assert model.cost() is None
    slow, fast = StepCost(200.0, 20.0, 8.0), StepCost(50.0, 4.0, 2.0)
    for rows, tokens, _, ms in line(slow, MIXED * 6):
        model.observe(rows, tokens, ms / 1000)
    cost = model.cost()
    assert cost is not None
    assert cost.ms(16, 64) == pytest.approx(slow.ms(16, 64), rel=1e-3)
    for rows, tokens, _, ms in line(fast, MIXED * 6):
        model.observe(rows, tokens, ms / 1000)
    assert len(model.samples) == WINDOW
    cost = model.cost()
    assert cost is not None
    assert cost.ms(16, 64) == pytest.approx(fast.ms(16, 64), rel=1e-3)


def test_empty_steps_are_not_samples() -> None:
    model = StepCostModel()
    model.observe(0, 0, 0.5)
    assert model.cost() is None


def test_attention_is_told_apart_from_the_tokens_it_comes_with() -> None:
    """A 256-token chunk costs more deep into a long prompt: the fit says why, so it
    predicts a chunk at a depth it has not seen yet."""
    truth = StepCost(fixed=20.0, per_row=3.0, per_token=2.0, per_kscore=0.02)
    samples: list[Sample] = []
    for rows, tokens, offset in [
        (16, 0, 0),
        (32, 0, 0),
        (16, 64, 0),
        (16, 256, 512),
        (8, 256, 1024),
        (16, 128, 2048),
        (0, 256, 0),
        (0, 256, 1536),
        (32, 32, 256),
    ]:
        kscores = (rows * 300 + tokens * offset + tokens * tokens // 2) / 1000
        samples.append((rows, tokens, kscores, truth.ms(rows, tokens, kscores)))
    got = fit(samples)
    deep = (256 * 6000 + 256 * 256 // 2) / 1000
    assert got.ms(0, 256, deep) == pytest.approx(truth.ms(0, 256, deep), rel=1e-3)
    assert got.per_kscore == pytest.approx(0.02, rel=1e-3)
