"""One sampling step over the real vocabulary: mlx-lm's sampler against ours.

For B = 64, 16 and 1 rows of random logits of the default model's vocabulary size
(151,936), it times the step the engine takes after a forward, from evaluated logits
to token ids in Python:

- *mlx-lm* (the path the server used): greedy `argmax`; otherwise `make_sampler`'s
  Gumbel `categorical` over the whole vocabulary, after `apply_top_p` (a full sort of
  the log-probabilities, normalised with the CPU forms' `fast_log_softmax`) or
  `apply_top_k`;
- *ours* (`model/sampling.py` and `model/draw.py`): numpy on a zero-copy view,
  inverse CDF, the exact top-p pre-filter, top-k by partition; each row its own
  generator.

Cases: greedy, temperature 1, temperature 1 with top_p 0.95, temperature 1 with top_k 40.
The logits: `--logits peaked` (default) are standard normal times 2.6 with 32 tokens
raised by 8 to 18, the shape of the default model's (the largest logit 16 to 22 above
the mean; a 0.95 nucleus of a few to a few thousand tokens); `--logits flat` leaves
them normal, the worst case for top-p (a nucleus of ~30,000). Prints medians of
`--repeats` steps; asserts nothing.

    .venv/bin/python bench/sampler.py [--rows 64,16,1] [--repeats 7] [--logits peaked|flat]
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

from mlxcel.model.native.blas import load_fast_blas

load_fast_blas()  # before mlx.core

import mlx.core as mx  # noqa: E402
import numpy as np  # noqa: E402
from mlx_lm.sample_utils import make_sampler  # noqa: E402

from mlxcel.generation import Sampling  # noqa: E402
from mlxcel.model.draw import keep, row_generator  # noqa: E402
from mlxcel.model.native.cpu_forms import fast_log_softmax  # noqa: E402
from mlxcel.model.sampling import Sampler  # noqa: E402

VOCAB = 151_936
CASES = {
    "greedy": Sampling(temperature=0.0),
    "temperature 1": Sampling(temperature=1.0),
    "top_p 0.95": Sampling(temperature=1.0, top_p=0.95),
    "top_k 40": Sampling(temperature=1.0, top_k=40),
}


def make_logits(rows: int, kind: str, seed: int) -> mx.array:
    rng = np.random.default_rng(seed)
    logits = rng.standard_normal((rows, VOCAB), dtype=np.float32) * 2.6
    if kind == "peaked":
        for row in logits:
            head = rng.choice(VOCAB, 32, replace=False)
            row[head] += rng.uniform(8.0, 18.0, 32).astype(np.float32)
    out = mx.array(logits)
    mx.eval(out)
    return out


def theirs(sampling: Sampling) -> Callable[[mx.array], list[int]]:
    """The step as the server took it with mlx-lm's sampler (one setting for all rows)."""
    if sampling.temperature <= 0:
        return lambda logits: mx.argmax(logits, axis=-1).tolist()  # type: ignore[return-value]
    top_p = sampling.top_p if sampling.top_p < 1 else 0.0
    sampler = make_sampler(temp=sampling.temperature, top_p=top_p, top_k=sampling.top_k)

    def step(logits: mx.array) -> list[int]:
        inputs = fast_log_softmax(logits) if top_p else logits
        return sampler(inputs).tolist()  # type: ignore[no-any-return]

    return step


def ours(sampling: Sampling, rows: int) -> Callable[[mx.array], list[int]]:
    sampler, settings = Sampler(fast_log_softmax), [sampling] * rows
    gens = [row_generator(i) for i in range(rows)]
    return lambda logits: sampler.sample(logits, settings, gens)[0]


def median_ms(step: Callable[[mx.array], list[int]], logits: list[mx.array]) -> float:
    step(logits[0])  # warm-up (mlx-lm compiles its samplers)
    times = []
    for batch in logits:
        started = time.perf_counter()
        step(batch)
        times.append(time.perf_counter() - started)
    return statistics.median(times) * 1e3


def nucleus(logits: mx.array, top_p: float) -> int:
    """The median size of the rows' nuclei."""
    rows = np.asarray(logits)
    buf = np.empty(VOCAB, dtype=np.float32)
    return int(statistics.median(len(keep(row, top_p, 0, buf)) for row in rows[:16]))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rows", default="64,16,1", help="batch sizes (default: 64,16,1)")
    p.add_argument("--repeats", type=int, default=7, help="steps timed per case (default: 7)")
    p.add_argument("--logits", choices=("peaked", "flat"), default="peaked")
    args = p.parse_args()
    print(f"{args.logits} logits, vocabulary {VOCAB:,}; median ms per step of {args.repeats}")
    print("\n| B | case | mlx-lm ms | ours ms | speed-up |\n|---|---|---|---|---|")
    for rows in (int(x) for x in args.rows.split(",")):
        logits = [make_logits(rows, args.logits, seed) for seed in range(args.repeats)]
        for name, sampling in CASES.items():
            old = median_ms(theirs(sampling), logits)
            new = median_ms(ours(sampling, rows), logits)
            print(f"| {rows} | {name} | {old:.1f} | {new:.1f} | {old / new:.1f}x |", flush=True)
        print(f"| {rows} | (0.95 nucleus: median {nucleus(logits[0], 0.95)} tokens) | | | |")


if __name__ == "__main__":
    main()
