"""Benchmark prompts: distinct, ~95 tokens each, sharing a ~35-token prefix.

Tokens are counted with the model's own tokenizer when the folder has one, else
estimated from words. The same uid always gives the same prompt.
"""

from __future__ import annotations

import importlib
import random
from pathlib import Path
from typing import Any

PROMPT_TOKENS = 95

PREFIX = (
    "You are a senior Python engineer reviewing a small logistics code base. Reply with "
    "complete, fully type-annotated Python code only: no prose, no explanations, no "
    "markdown headings. "
)
VERBS = (
    "parse",
    "validate",
    "merge",
    "summarise",
    "group",
    "rank",
    "filter",
    "schedule",
    "reconcile",
    "estimate",
    "normalise",
    "split",
    "deduplicate",
    "route",
    "price",
)
NOUNS = (
    "shipments",
    "invoices",
    "pallets",
    "routes",
    "drivers",
    "warehouses",
    "orders",
    "parcels",
    "customs_forms",
    "delivery_slots",
    "fuel_logs",
    "containers",
)
DETAILS = (
    "Use dataclasses for the records and raise ValueError with a helpful message on bad input.",
    "Accept an iterable of dictionaries read from a CSV export and return a sorted list.",
    "Handle missing fields, empty strings and negative weights gracefully.",
    "Include a small command line entry point built with argparse that prints a summary.",
    "Keep the public function pure and put all input and output in a separate helper.",
    "Group the results by ISO week and compute totals, averages and the maximum per group.",
    "Write docstrings for every public function and add three doctest examples.",
    "Times are UTC ISO 8601 strings; convert them with datetime.fromisoformat.",
    "Weights are in kilograms and distances in kilometres; round money to two decimals.",
    "Log skipped rows with the logging module at warning level, never print them.",
)


class TokenCounter:
    """Counts tokens with the model's own tokenizer when available, else by words."""

    def __init__(self, model_dir: Path | None) -> None:
        self._tok: Any = None
        path = model_dir / "tokenizer.json" if model_dir is not None else None
        if path is not None and path.is_file():
            tokenizers = importlib.import_module("tokenizers")
            self._tok = tokenizers.Tokenizer.from_file(str(path))

    @property
    def exact(self) -> bool:
        return self._tok is not None

    def count(self, text: str) -> int:
        if self._tok is None:
            return round(len(text.split()) * 1.3)
        return len(self._tok.encode(text, add_special_tokens=False).ids)

    def truncate(self, text: str, tokens: int) -> str:
        if self._tok is None:
            return " ".join(text.split()[: max(1, round(tokens / 1.3))])
        ids = self._tok.encode(text, add_special_tokens=False).ids[:tokens]
        return str(self._tok.decode(ids))


def make_prompt(uid: str, counter: TokenCounter) -> str:
    """The shared prefix plus a request-specific task, ~PROMPT_TOKENS tokens in all."""
    rng = random.Random(uid)
    verb, noun = rng.choice(VERBS), rng.choice(NOUNS)
    details = list(DETAILS)
    rng.shuffle(details)
    body = f"Ticket {uid}: implement `{verb}_{noun}(rows)` to {verb} {noun.replace('_', ' ')}."
    budget = PROMPT_TOKENS - counter.count(PREFIX)
    for line in details:
        if counter.count(body) >= budget:
            break
        body += " " + line
    return PREFIX + counter.truncate(body, budget)


def make_long_prompt(uid: str, counter: TokenCounter, tokens: int) -> str:
    """The shared prefix, a task and `tokens` tokens in all of request-specific sample rows.

    The rows are random records seeded by `uid`, so two long prompts share only the prefix
    and no prompt cache can shorten the prefill of one with the other.
    """
    rng = random.Random(f"long-{uid}")
    verb, noun = rng.choice(VERBS), rng.choice(NOUNS)
    body = (
        f"Ticket {uid}: implement `{verb}_{noun}(rows)` to {verb} {noun.replace('_', ' ')}, "
        f"then show its output for the sample rows below. {rng.choice(DETAILS)}\nSample rows:\n"
    )
    budget = tokens - counter.count(PREFIX)
    while counter.count(body) < budget:
        rows = []
        for _ in range(20):
            day = rng.randint(1, 28)
            rows.append(
                f"{rng.choice(NOUNS)[:-1]} {rng.randint(10000, 99999)}, warehouse "
                f"{rng.randint(1, 60)}, route {rng.randint(1, 400)}, "
                f"{rng.uniform(0.5, 900.0):.1f} kg, due 2025-{rng.randint(1, 12):02d}-{day:02d}, "
                f"driver {rng.choice(VERBS)}-{rng.randint(1, 99)}"
            )
        body += "\n".join(rows) + "\n"
    return PREFIX + counter.truncate(body, budget)
