"""The numpy sampler: its draws follow exactly the distribution asked for, its top-p and
top-k sets are a full sort's, and a seed repeats whatever is batched beside it.

The expected distributions and kept sets come from a brute-force reference here (a full
descending sort of the row); the draws are tested against them with Pearson's
chi-square over 10^5 draws per case, at a fixed seed.
"""

from __future__ import annotations

import numpy as np
import pytest

from mlxcel.generation import Sampling
from mlxcel.model import draw as draw_module
from mlxcel.model.draw import FIRST_CANDIDATES, draw, draw_row, keep, row_generator

from chi_square import chi_square_p, upper_gamma_q

DRAWS = 100_000
SIGNIFICANCE = 1e-4
"""A case passes when its p-value is above this (the draws are seeded, so a pass is
stable); the negative controls must fall below it."""


def reference_kept(row: np.ndarray, top_p: float = 1.0, top_k: int = 0) -> set[int]:
    """The tokens top_p and top_k keep, by a full descending sort of the whole row."""
    values = np.sort(row)[::-1]
    kept = row > -np.inf
    if 0 < top_p < 1:
        p = np.exp(row - row.max())  # float32, as the sampler's (its total is the same sum)
        running = np.cumsum(np.sort(p)[::-1], dtype=np.float64)
        reached = running >= top_p * float(p.sum())
        size = int(np.argmax(reached)) + 1 if reached.any() else len(row)
        kept &= row >= values[size - 1]
    if 0 < top_k < len(row):
        kept &= row >= values[top_k - 1]
    return {int(i) for i in np.flatnonzero(kept)}


def expected(
    row: np.ndarray, temperature: float, top_p: float = 1.0, top_k: int = 0
) -> list[float]:
    """The exact distribution: the kept tokens' probabilities at the temperature."""
    ids = sorted(reference_kept(row, top_p, top_k))
    weights = np.zeros(len(row))
    weights[ids] = np.exp((row[ids].astype(np.float64) - float(row.max())) / temperature)
    return list(weights / weights.sum())


def counts(row: np.ndarray, sampling: Sampling, seed: int, n: int = DRAWS) -> list[int]:
    rng, buf = row_generator(seed), np.empty(len(row), dtype=np.float32)
    tokens = [draw_row(row, sampling, rng, buf) for _ in range(n)]
    return list(np.bincount(tokens, minlength=len(row)))


def small_row(vocab: int = 24, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).uniform(-1.5, 1.5, vocab).astype(np.float32)


def masked_row() -> np.ndarray:
    row = small_row(30, seed=1)
    row[[0, 3, 4, 5, 6, 7, 8, 9, 17, 29]] = -np.inf  # a whole block of 5 among them
    return row


CASES = {
    "temperature 1": (small_row(), Sampling(temperature=1.0)),
    "temperature 0.5": (small_row(), Sampling(temperature=0.5)),
    "temperature 1.7": (small_row(seed=2), Sampling(temperature=1.7)),
    "top_p": (small_row(), Sampling(temperature=1.0, top_p=0.8)),
    "top_p tempered": (small_row(seed=3), Sampling(temperature=0.6, top_p=0.7)),
    "top_k": (small_row(), Sampling(temperature=1.3, top_k=7)),
    "top_p and top_k": (small_row(seed=4), Sampling(temperature=0.8, top_p=0.9, top_k=6)),
    "grammar mask": (masked_row(), Sampling(temperature=1.0)),
    "grammar mask, top_p": (masked_row(), Sampling(temperature=0.9, top_p=0.85)),
    "many blocks": (
        (np.random.default_rng(5).standard_normal(2_500) * 0.3).astype(np.float32),
        Sampling(temperature=1.0),
    ),
}


@pytest.mark.parametrize("name", list(CASES))
def test_draws_fit_the_exact_distribution(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    row, sampling = CASES[name]
    if len(row) < 100:  # blocks of 5: the block search, a tail and a fully masked block
        monkeypatch.setattr(draw_module, "BLOCK", 5)
    want = expected(row, sampling.temperature, sampling.top_p, sampling.top_k)
    assert min(DRAWS * p for p in want if p > 0) >= 5  # chi-square's own precondition
    filtered = sampling.top_p < 1 or sampling.top_k > 0 or bool(np.isinf(row).any())
    assert filtered == (0.0 in want)  # each filter case leaves tokens out
    assert chi_square_p(counts(row, sampling, seed=11), want) > SIGNIFICANCE


def test_the_fit_catches_a_wrong_temperature() -> None:
    row = small_row()
    got = counts(row, Sampling(temperature=0.5), seed=11)
    assert chi_square_p(got, expected(row, 0.5)) > SIGNIFICANCE
    assert chi_square_p(got, expected(row, 1.0)) < SIGNIFICANCE


def test_the_fit_catches_a_nucleus_tempered_first() -> None:
    """Hugging Face's order (temperature, then top_p) keeps fewer tokens here: the test
    tells the two readings apart."""
    row, sampling = CASES["top_p tempered"]
    got = counts(row, sampling, seed=11)
    tempered = row / np.float32(sampling.temperature)
    assert reference_kept(tempered, sampling.top_p) != reference_kept(row, sampling.top_p)
    assert chi_square_p(got, expected(tempered, 1.0, sampling.top_p)) < SIGNIFICANCE


def test_the_p_value_helper_matches_closed_forms() -> None:
    for x in (0.1, 1.0, 3.0, 10.0, 40.0):
        assert upper_gamma_q(1.0, x) == pytest.approx(np.exp(-x), rel=1e-10)  # two dof
        q = np.exp(-x) * (1 + x + x * x / 2)  # six degrees of freedom
        assert upper_gamma_q(3.0, x) == pytest.approx(q, rel=1e-10)


def random_rows(trials: int) -> list[tuple[np.ndarray, float, int]]:
    """Rows with ties (rounded logits), masks, flat and peaked shapes, small and large
    vocabularies (nuclei past `FIRST_CANDIDATES` and past a quarter of the row)."""
    rng = np.random.default_rng(2024)
    out = []
    for _ in range(trials):
        vocab = int(rng.choice([5, 40, 300, 3_000]))
        row = rng.standard_normal(vocab) * rng.choice([0.05, 0.5, 2.0, 6.0])
        if rng.random() < 0.5:
            row = np.round(row * rng.choice([1, 4]))  # many ties, at the edges too
        if rng.random() < 0.3:
            row[rng.random(vocab) < 0.5] = -np.inf
            row[rng.integers(vocab)] = 1.0  # at least one token left
        top_p = float(rng.choice([1.0, 0.01, 0.5, 0.9, 0.95, 0.999, rng.random()]))
        top_k = int(rng.choice([0, 0, 1, 3, 50, vocab - 1, vocab + 5]))
        if top_p == 1.0 and not 0 < top_k < vocab:
            top_p = 0.9
        out.append((row.astype(np.float32), top_p, top_k))
    return out


def test_kept_sets_equal_a_full_sort() -> None:
    grew = 0
    for row, top_p, top_k in random_rows(1_500):
        buf = np.empty(len(row), dtype=np.float32)
        effective_k = top_k if 0 < top_k < len(row) else 0
        got = keep(row, top_p if top_p < 1 else 1.0, effective_k, buf)
        assert list(got) == sorted(got)
        assert set(got.tolist()) == reference_kept(row, top_p, top_k), (top_p, top_k, row)
        grew += len(got) > FIRST_CANDIDATES
    assert grew > 50  # the pre-filter's growth was exercised


def test_a_misleading_sample_still_finds_the_nucleus() -> None:
    """The pre-filter's size guess reads every 16th token: here those are one heavy token
    and near-zero ones, while the nucleus is thousands of the others."""
    rng = np.random.default_rng(6)
    row = (rng.standard_normal(40_000) * 0.01).astype(np.float32)
    row[::16], row[0] = -10.0, 8.0
    buf = np.empty(len(row), dtype=np.float32)
    for top_p in (0.08, 0.3, 0.6, 0.9):
        assert set(keep(row, top_p, 0, buf).tolist()) == reference_kept(row, top_p)


def test_top_k_ties_keep_every_token_equal_to_the_kth() -> None:
    row = np.array([3, 1, 2, 2, 2, 0, 2], dtype=np.float32)
    buf = np.empty(len(row), dtype=np.float32)
    assert keep(row, 1.0, 2, buf).tolist() == [0, 2, 3, 4, 6]
    assert keep(row, 1.0, 1, buf).tolist() == [0]


def test_a_nucleus_that_reaches_top_p_exactly_ends_there() -> None:
    """mlx-lm's rule: a token is dropped when the mass above it is at least top_p."""
    half = np.float32(-np.log(2.0))
    assert np.exp(half) == 0.5  # masses 1, 0.5, 0.5: the first is exactly half of 2
    row = np.array([0.0, half, half], dtype=np.float32)
    buf = np.empty(3, dtype=np.float32)
    assert keep(row, 0.5, 0, buf).tolist() == [0]
    assert keep(row, 0.5000001, 0, buf).tolist() == [0, 1, 2]


def test_a_row_with_one_allowed_token_always_draws_it() -> None:
    row = np.full(300, -np.inf, dtype=np.float32)
    row[123] = -5.0
    rng, buf = row_generator(1), np.empty(300, dtype=np.float32)
    for sampling in (
        Sampling(temperature=0.3),
        Sampling(temperature=2.0),
        Sampling(temperature=1.0, top_p=0.5),
        Sampling(temperature=1.0, top_k=3),
        Sampling(temperature=1.0, top_p=0.99, top_k=200),
    ):
        assert {draw_row(row, sampling, rng, buf) for _ in range(200)} == {123}


def test_a_row_with_nothing_allowed_takes_the_argmax() -> None:
    row = np.full(50, -np.inf, dtype=np.float32)
    buf = np.empty(50, dtype=np.float32)
    for sampling in (Sampling(temperature=1.0), Sampling(temperature=1.0, top_p=0.5, top_k=3)):
        assert draw_row(row, sampling, row_generator(1), buf) == 0


def test_greedy_rows_take_the_first_argmax_and_draw_nothing() -> None:
    rng = np.random.default_rng(3)
    logits = np.round(rng.standard_normal((20, 500)) * 2).astype(np.float32)  # ties
    gens = [row_generator(9) for _ in range(20)]
    assert draw(logits, [Sampling(temperature=0.0)] * 20, gens) == list(logits.argmax(axis=1))
    assert gens[0].random() == row_generator(9).random()  # no uniform was spent


def test_filters_out_of_range_are_off() -> None:
    row = small_row(40)
    plain = counts(row, Sampling(temperature=1.0), seed=4, n=300)
    for sampling in (
        Sampling(temperature=1.0, top_p=0.0),
        Sampling(temperature=1.0, top_p=1.0, top_k=40),
        Sampling(temperature=1.0, top_k=-1),
    ):
        assert counts(row, sampling, seed=4, n=300) == plain


def seeded_tokens(seed: int, position: int, batch: int, steps: int = 40) -> list[int]:
    """The tokens of a row seeded with `seed` at `position` of a batch of others with
    their own settings and generators."""
    rng = np.random.default_rng(0)
    others = [Sampling(temperature=0.7), Sampling(temperature=1.0, top_p=0.9, top_k=5)]
    rows = [others[i % 2] for i in range(batch)]
    rows[position] = Sampling(temperature=1.0, top_p=0.95)
    gens = [row_generator() for _ in range(batch)]
    gens[position] = row_generator(seed)
    out: list[int] = []
    for _ in range(steps):
        logits = (rng.standard_normal((batch, 64)) * 0.5).astype(np.float32)
        logits[position] = small_row(64, seed=len(out))  # the seeded row's logits per step
        out.append(draw(logits, rows, gens)[position])
    return out


def test_a_seed_repeats_whatever_is_batched_beside_it() -> None:
    alone = seeded_tokens(1234, 0, 1)
    assert seeded_tokens(1234, 2, 5) == alone
    assert seeded_tokens(1234, 1, 3) == alone
    assert seeded_tokens(1235, 0, 1) != alone


def test_generators_without_a_seed_differ_and_seeds_wrap_to_64_bits() -> None:
    first, second = row_generator(), row_generator()
    assert first.random(4).tolist() != second.random(4).tolist()
    assert row_generator(-1).random() == row_generator(2**64 - 1).random()
