"""`truncation: "auto"`: an input longer than the context window loses its oldest turns.

The history the prompt renders (a chain's or conversation's turns, then the request's
input, compactions replayed) is cut at one of the places compaction may cut (before a
user turn, or after a completed tool-call group: a call is never parted from its output),
never after the last user message, and the leading system and developer messages are
always kept (as are `instructions`, which render apart). The cut is the earliest that
leaves the prompt room for the reply: `max_output_tokens`, or `DEFAULT_OUTPUT_RESERVE`
tokens when unset, at most a quarter of the window.

A cheap character bound (`limits.CHARS_PER_TOKEN`) rules out the cuts that cannot fit;
the rest are searched from the newest turn back, doubling, then halving, so the renders
cost a few times the kept prompt, whatever the input's length.
"""

from __future__ import annotations

import itertools
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from mlxcel.errors import ContextLengthExceeded
from mlxcel.items import Item, Message, replay
from mlxcel.prepare.compaction import cut_points
from mlxcel.prepare.limits import CHARS_PER_TOKEN, ITEMS_PER_TOKEN, item_chars

log = logging.getLogger(__name__)

DEFAULT_OUTPUT_RESERVE = 1024
"""Tokens kept free for the reply when the request sets no `max_output_tokens`."""
MARKUP_CHARS = 1
"""Characters each item is counted for besides its text (the bound only rules out)."""


@dataclass(frozen=True, slots=True)
class Fitted:
    """The prompt of the items kept, and how many of the rendered items were dropped."""

    prompt: list[int]
    dropped: int


def note_dropped(response_id: str, dropped: int, prompt_tokens: int) -> None:
    """The server log's line for a truncated prompt (the client sees a header)."""
    if dropped:
        log.info(
            "%s: truncation auto dropped the %d oldest input items (prompt %d tokens)",
            response_id,
            dropped,
            prompt_tokens,
        )


def output_reserve(max_output_tokens: int | None, context_length: int) -> int:
    """The tokens a truncated prompt leaves for the reply."""
    wanted = max_output_tokens or DEFAULT_OUTPUT_RESERVE
    return max(1, min(wanted, context_length // 4))


def fit(
    items: Sequence[Item],
    render: Callable[[Sequence[Item]], list[int]],
    budget: int,
    fixed_chars: int = 0,
) -> Fitted:
    """The prompt `render` makes of the most of `items` whose prompt is at most `budget`
    tokens; `fixed_chars` are the characters rendered besides the items (instructions,
    tools). A 400 when even the last user turn and what follows it do not fit."""
    replayed = replay(items)
    lead = list(itertools.takewhile(_is_system, replayed))
    turns = replayed[len(lead) :]
    users = [k for k, i in enumerate(turns) if isinstance(i, Message) and i.role == "user"]
    last = users[-1] if users else len(turns)
    cuts = sorted({0, *(p for p in cut_points(turns) if p <= last)})
    first = _first_possible(lead, turns, cuts, budget, fixed_chars)

    def attempt(index: int) -> list[int] | None:
        prompt = render([*lead, *turns[cuts[index] :]])
        return prompt if len(prompt) <= budget else None

    whole = attempt(0) if first == 0 else None  # the common case: it all fits
    if whole is not None:
        return Fitted(whole, 0)
    found = _earliest(attempt, first, len(cuts) - 1)
    if found is None:
        raise ContextLengthExceeded(
            "The input does not fit the context window even with every turn before the "
            "last user message dropped (truncation: auto).",
            maximum=budget,
        )
    index, prompt = found
    return Fitted(prompt, cuts[index])


def _is_system(item: Item) -> bool:
    return isinstance(item, Message) and item.role in ("system", "developer")


def _first_possible(
    lead: Sequence[Item], turns: Sequence[Item], cuts: Sequence[int], budget: int, fixed: int
) -> int:
    """The first cut whose kept items pass the character and item bounds (the last cut
    when none does: it is tried all the same, and answers for itself)."""
    chars = fixed + sum(item_chars(i) + MARKUP_CHARS for i in lead)
    tail = [0] * (len(turns) + 1)  # characters of turns[k:]
    for k in range(len(turns) - 1, -1, -1):
        tail[k] = tail[k + 1] + item_chars(turns[k]) + MARKUP_CHARS
    for index, cut in enumerate(cuts):
        count = len(lead) + len(turns) - cut
        if chars + tail[cut] <= CHARS_PER_TOKEN * budget and count <= ITEMS_PER_TOKEN * budget:
            return index
    return len(cuts) - 1


def _earliest(
    attempt: Callable[[int], list[int] | None], low: int, high: int
) -> tuple[int, list[int]] | None:
    """The least index in low..high whose attempt succeeds, given that success is
    monotonic (a later index keeps fewer items): doubling back from `high`, then
    bisecting, so the largest prompts rendered are about twice the kept one."""
    best = attempt(high)
    if best is None:
        return None
    good, step = high, 1
    bad = low - 1
    while good > low:
        probe = max(low, good - step)
        prompt = attempt(probe)
        if prompt is None:
            bad = probe
            break
        good, best, step = probe, prompt, step * 2
    while good - bad > 1:
        middle = (good + bad) // 2
        prompt = attempt(middle)
        if prompt is None:
            bad = middle
        else:
            good, best = middle, prompt
    return good, best
