"""`truncation: "auto"`'s cut, on generated histories with a character-count renderer: the
lead and the last user turn stay, no call is parted from its output, and the cut is the
earliest that fits."""

from __future__ import annotations

from collections.abc import Sequence

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mlxcel.errors import ContextLengthExceeded, InvalidRequest
from mlxcel.items import FunctionCall, FunctionCallOutput, InputText, Item, Message, OutputText
from mlxcel.prepare.truncation import MAX_RUN, fit, output_reserve


def user(text: str) -> Message:
    return Message("user", (InputText(text),))


def render(items: Sequence[Item]) -> list[int]:
    """One token per character of each item's text, plus one per item."""
    size = 0
    for item in items:
        if isinstance(item, Message):
            size += len(item.text) + 1
        elif isinstance(item, FunctionCall):
            size += len(item.arguments) + 1
        elif isinstance(item, FunctionCallOutput):
            size += len(item.output) + 1
    return [0] * size


@st.composite
def histories(draw: st.DrawFn) -> list[Item]:
    items: list[Item] = [Message("system", (InputText("lead"),))]
    for n in range(draw(st.integers(1, 12))):
        items.append(user("u" * draw(st.integers(1, 40))))
        for k in range(draw(st.integers(0, 2))):
            call_id = f"c{n}-{k}"
            items.append(FunctionCall(call_id, "f", "a" * draw(st.integers(1, 30)), f"fc{n}{k}"))
            items.append(FunctionCallOutput(call_id, "o" * draw(st.integers(1, 30)), f"o{n}{k}"))
        items.append(Message("assistant", (OutputText("r" * draw(st.integers(1, 40))),)))
    items.append(user("last question"))
    return items


@settings(max_examples=200, deadline=None)
@given(histories(), st.integers(20, 600))
def test_the_cut_keeps_what_it_must_and_is_the_earliest(items: list[Item], budget: int) -> None:
    try:
        fitted = fit(items, render, budget)
    except ContextLengthExceeded:
        tail = len(render([items[0], items[-1]]))
        assert tail > budget  # only when the lead and the last turn alone cannot fit
        return
    kept = [items[0], *items[1 + fitted.dropped :]]
    assert len(fitted.prompt) == len(render(kept)) <= budget
    assert kept[-1] is items[-1]
    calls = {i.call_id for i in kept if isinstance(i, FunctionCall)}
    outputs = {i.call_id for i in kept if isinstance(i, FunctionCallOutput)}
    assert calls == outputs
    if fitted.dropped:
        # The cut falls before a message, or right after a call's output.
        first_kept, last_dropped = kept[1], items[fitted.dropped]
        assert isinstance(first_kept, Message) or isinstance(last_dropped, FunctionCallOutput)
        # Any earlier place a cut may fall would not fit.
        for start in range(1, 1 + fitted.dropped):
            first = items[start]
            if isinstance(first, Message) and first.role == "user":
                assert len(render([items[0], *items[start:]])) > budget


def test_nothing_is_dropped_when_it_fits() -> None:
    items: list[Item] = [user("a"), Message("assistant", (OutputText("b"),)), user("c")]
    fitted = fit(items, render, 100)
    assert fitted.dropped == 0
    assert len(fitted.prompt) == 6


def test_the_reserve_is_bounded_by_the_window() -> None:
    assert output_reserve(None, 32768) == 1024
    assert output_reserve(50, 32768) == 50
    assert output_reserve(10_000, 4096) == 1024
    assert output_reserve(None, 2) == 1


def test_a_last_turn_over_the_budget_is_refused() -> None:
    with pytest.raises(ContextLengthExceeded):
        fit([user("x" * 10), Message("assistant", (OutputText("y"),)), user("z" * 50)], render, 20)


@settings(max_examples=200, deadline=None)
@given(histories(), st.integers(20, 600), st.sampled_from(["short", "long", "refused"]))
def test_a_count_that_is_off_moves_the_cut_but_never_past_the_budget(
    items: list[Item], budget: int, kind: str
) -> None:
    """A template that renders runs apart differently than together (counted short or
    long), or will not render them apart at all, still gets a prompt within the budget
    that keeps the lead and the last user turn."""

    def measure(run: Sequence[Item]) -> int:
        if kind == "refused":
            raise InvalidRequest("The chat template rejected the input.", param="input")
        return len(render(run)) // 2 if kind == "short" else 2 * len(render(run))

    try:
        fitted = fit(items, render, budget, measure=measure)
    except ContextLengthExceeded:
        assert kind == "long" or len(render([items[0], items[-1]])) > budget
        return
    kept = [items[0], *items[1 + fitted.dropped :]]
    assert len(fitted.prompt) == len(render(kept)) <= budget
    assert kept[-1] is items[-1]


class Counted:
    """A measure and a renderer that record the items each call was given."""

    def __init__(self) -> None:
        self.counted: list[int] = []
        self.rendered: list[int] = []

    def measure(self, run: Sequence[Item]) -> int:
        self.counted.append(len(run))
        return len(render(run))

    def render(self, run: Sequence[Item]) -> list[int]:
        self.rendered.append(len(run))
        return render(run)


@pytest.mark.parametrize("size", [1_000, 99_000])
def test_the_work_follows_what_is_kept_not_the_inputs_length(size: int) -> None:
    """Each item kept is counted about once, in batches, then rendered once with the
    others: the same work for 1,000 items as for 99,000."""
    items: list[Item] = [Message("system", (InputText("lead"),))]
    for n in range(size):
        items.append(user(f"u{n}"))
        items.append(Message("assistant", (OutputText(f"a{n}"),)))
    items.append(user("last question"))
    work = Counted()
    fitted = fit(items, work.render, 600, measure=work.measure)
    kept = len(items) - fitted.dropped
    assert 50 < kept < 300
    assert sum(work.counted) <= 2 * kept + 2 * MAX_RUN
    assert len(work.counted) <= kept // 16 + MAX_RUN
    assert work.rendered == [2, kept]  # what must be kept, then the prompt


def test_a_lead_too_long_is_refused_after_counting_a_windows_worth() -> None:
    items: list[Item] = [Message("system", (InputText(f"s{n}"),)) for n in range(99_000)]
    items.append(user("last question"))
    work = Counted()
    with pytest.raises(ContextLengthExceeded):
        fit(items, work.render, 600, measure=work.measure)
    assert sum(work.counted) < 1_000
    assert work.rendered == []
