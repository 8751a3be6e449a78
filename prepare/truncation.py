"""`truncation: "auto"`: an input longer than the context window loses its oldest turns.

The history the prompt renders (a chain's or conversation's turns, then the request's
input, compactions replayed) is cut at one of the places compaction may cut (before a
user turn, or after a completed tool-call group: a call is never parted from its output),
never after the last user message, and the leading system and developer messages are
always kept (as are `instructions`, which render apart). The cut is the earliest that
leaves the prompt room for the reply: `max_output_tokens`, or `DEFAULT_OUTPUT_RESERVE`
tokens when unset, at most a quarter of the window.

The cut is counted, not searched for: what must be kept (the leading messages, the last
user turn and what follows it) is counted before it is rendered, then the turns from the
newest back, until the window is full (`measure`: the tokens a run of items adds to a
prompt, asked of a few dozen items at a time). So the work follows what is kept, whatever
the input's length: each item kept is counted about once, the prompt is rendered once, and
an input that cannot fit is refused after counting about a window's worth of it. A run
that cannot fit by its characters or items alone (`limits.CHARS_PER_TOKEN`,
`ITEMS_PER_TOKEN`) is not even counted, and a long one is counted from its newest item
only until the window is full. A template that renders a run apart differently than in
the whole prompt only moves the cut: a count that falls short has the later cuts tried
with the renderer, and a template that will not render a run apart has the cut searched
for with the renderer alone (from the newest turn back, doubling, then halving).
"""

from __future__ import annotations

import itertools
import logging
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from mlxcel.errors import ContextLengthExceeded, InvalidRequest
from mlxcel.generation import PromptCodec
from mlxcel.items import InputText, Item, Message, replay
from mlxcel.prepare.chat_messages import to_chat
from mlxcel.prepare.compaction import cut_points
from mlxcel.prepare.limits import CHARS_PER_TOKEN, ITEMS_PER_TOKEN, item_chars

log = logging.getLogger(__name__)

DEFAULT_OUTPUT_RESERVE = 1024
"""Tokens kept free for the reply when the request sets no `max_output_tokens`."""
MARKUP_CHARS = 1
"""Characters each item is counted for besides its text (the bound only rules out)."""
MAX_RUN = 64
"""Items counted in one call at most: few calls for many short turns, and a longer run (a
tool-call group of thousands of items) is counted in parts, newest first, only until the
window is full."""

Render = Callable[[Sequence[Item]], list[int]]
Measure = Callable[[Sequence[Item]], int]
"""The tokens a run of items adds to a prompt."""


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


def turn_measure(codec: PromptCodec, template_kwargs: Mapping[str, Any] | None) -> Measure:
    """What a run of items adds to a prompt `codec` renders: its render after a one-word
    user turn, less that turn's alone (so any run renders; instructions and tools, the
    same either way, are left out)."""
    probe = Message("user", (InputText("."),))
    base: list[int] = []

    def measure(run: Sequence[Item]) -> int:
        if not base:
            base.append(len(codec.render(to_chat(None, [probe]), None, template_kwargs)))
        rendered = codec.render(to_chat(None, [probe, *run]), None, template_kwargs)
        return len(rendered) - base[0]

    return measure


def fit(
    items: Sequence[Item],
    render: Render,
    budget: int,
    fixed_chars: int = 0,
    measure: Measure | None = None,
) -> Fitted:
    """The prompt `render` makes of the most of `items` whose prompt is at most `budget`
    tokens; `measure` counts what a run of items adds (by default its own render: right
    for a renderer that adds nothing of its own); `fixed_chars` are the characters
    rendered besides the items (instructions, tools). A 400 when even the leading
    messages, the last user turn and what follows it do not fit."""
    replayed = replay(items)
    lead = list(itertools.takewhile(_is_system, replayed))
    turns = replayed[len(lead) :]
    users = [k for k, i in enumerate(turns) if isinstance(i, Message) and i.role == "user"]
    last = users[-1] if users else len(turns)
    cuts = sorted({0, *(p for p in cut_points(turns) if p <= last)})
    count = _counting(measure or (lambda run: len(render(run))))
    try:
        return _fit_counted(lead, turns, cuts, render, count, budget)
    except _Unmeasured:
        return _fit_searched(lead, turns, cuts, render, budget, fixed_chars)


class _Unmeasured(Exception):
    """The template would not render a run of items apart."""


def _counting(measure: Measure) -> Measure:
    def count(run: Sequence[Item]) -> int:
        try:
            return measure(run)
        except ContextLengthExceeded:
            raise
        except InvalidRequest as exc:  # the template's refusal of the run alone
            raise _Unmeasured from exc

    return count


def _fit_counted(
    lead: list[Item],
    turns: list[Item],
    cuts: list[int],
    render: Render,
    count: Measure,
    budget: int,
) -> Fitted:
    """The cut found by counting (see the module's docstring)."""
    always = [*lead, *turns[cuts[-1] :]]
    if _cost(always, count, budget) > budget:
        raise _too_long(budget)
    anchor = render(always)
    if len(anchor) > budget:
        raise _too_long(budget)
    # The turns between cuts, newest first, sliced only as far as counting goes.
    groups = (turns[cuts[k] : cuts[k + 1]] for k in range(len(cuts) - 2, -1, -1))
    kept, _ = _fitting(groups, count, budget - len(anchor))
    if not kept:
        return Fitted(anchor, cuts[-1])
    index = len(cuts) - 1 - kept
    prompt = render([*lead, *turns[cuts[index] :]])
    if len(prompt) <= budget:
        return Fitted(prompt, cuts[index])

    def attempt(later: int) -> list[int] | None:
        tried = render([*lead, *turns[cuts[later] :]])
        return tried if len(tried) <= budget else None

    found = _earliest(attempt, index + 1, len(cuts) - 1)  # the count fell short
    if found is None:
        raise _too_long(budget)
    return Fitted(found[1], cuts[found[0]])


def _fitting(runs: Iterable[Sequence[Item]], count: Measure, room: int) -> tuple[int, int]:
    """How many of `runs` (newest first) fit in `room` tokens together, and their tokens;
    counting stops at the first that does not. Short runs are counted together, up to
    `MAX_RUN` items a call, and those of the batch that does not fit again one by one, so
    each item is counted at most twice, in few calls."""
    spent = kept = 0
    for batch in _batches(runs):
        cost = _cost([item for run in reversed(batch) for item in run], count, room - spent)
        if cost <= room - spent:
            spent, kept = spent + cost, kept + len(batch)
            continue
        for run in batch if len(batch) > 1 else ():
            cost = _cost(run, count, room - spent)
            if cost > room - spent:
                break
            spent, kept = spent + cost, kept + 1
        break
    return kept, spent


def _batches(runs: Iterable[Sequence[Item]]) -> Iterator[list[Sequence[Item]]]:
    """`runs` in batches of consecutive runs of at most `MAX_RUN` items together (a
    longer run alone)."""
    batch: list[Sequence[Item]] = []
    size = 0
    for run in runs:
        if batch and size + len(run) > MAX_RUN:
            yield batch
            batch, size = [], 0
        batch.append(run)
        size += len(run)
    if batch:
        yield batch


def _cost(run: Sequence[Item], count: Measure, room: int) -> int:
    """The tokens `run` adds, or any number over `room` once it is known not to fit: not
    counted at all when its characters or items rule it out; when long, counted in
    batches from its newest item, stopping once over `room`."""
    chars = sum(item_chars(i) + MARKUP_CHARS for i in run)
    if chars > CHARS_PER_TOKEN * room or len(run) > ITEMS_PER_TOKEN * room:
        return room + 1
    if len(run) <= MAX_RUN:
        return count(run)
    kept, spent = _fitting(([item] for item in reversed(run)), count, room)
    return spent if kept == len(run) else room + 1


def _too_long(budget: int) -> ContextLengthExceeded:
    return ContextLengthExceeded(
        "The input does not fit the context window even with every turn before the "
        "last user message dropped (truncation: auto).",
        maximum=budget,
    )


def _fit_searched(
    lead: list[Item],
    turns: list[Item],
    cuts: list[int],
    render: Render,
    budget: int,
    fixed_chars: int,
) -> Fitted:
    """The cut searched for with the renderer alone, for a template that will not render
    a run apart: the bounds rule out what cannot fit, then `_earliest`."""
    first = _first_possible(lead, turns, cuts, budget, fixed_chars)

    def attempt(index: int) -> list[int] | None:
        prompt = render([*lead, *turns[cuts[index] :]])
        return prompt if len(prompt) <= budget else None

    whole = attempt(0) if first == 0 else None  # the common case: it all fits
    if whole is not None:
        return Fitted(whole, 0)
    found = _earliest(attempt, first, len(cuts) - 1)
    if found is None:
        raise _too_long(budget)
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
