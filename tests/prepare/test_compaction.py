"""Compaction's split rules: where a history may be cut, and which turns a summary
replaces and which are preserved."""

from __future__ import annotations

from collections.abc import Sequence

import pytest

from mlxcel.errors import ContextLengthExceeded
from mlxcel.items import FunctionCall, FunctionCallOutput, InputText, Item, Message, OutputText
from mlxcel.prepare.compaction import cut_points, split, summarisable


def user(text: str) -> Message:
    return Message("user", (InputText(text),))


def assistant(text: str) -> Message:
    return Message("assistant", (OutputText(text),))


def call(call_id: str) -> FunctionCall:
    return FunctionCall(call_id, "get_weather", '{"city": "Paris"}')


def output(call_id: str) -> FunctionCallOutput:
    return FunctionCallOutput(call_id, "sunny")


def chars(items: Sequence[Item]) -> int:
    """A stand-in token count: the characters of the items' text."""
    return sum(len(getattr(i, "text", "") or getattr(i, "output", "")) for i in items)


# --- split rules ---------------------------------------------------------------------


def test_cuts_fall_before_user_turns_and_after_completed_tool_groups() -> None:
    items = [
        user("a"),  # 0
        assistant("b"),  # 1
        user("c"),  # 2
        call("1"),  # 3
        call("2"),  # 4
        output("1"),  # 5
        output("2"),  # 6
        assistant("d"),  # 7: after the completed group
        user("e"),  # 8
    ]
    assert cut_points(items) == [0, 2, 7, 8]


def test_no_cut_while_a_call_waits_for_its_output() -> None:
    items = [user("a"), call("1"), call("2"), output("1"), user("b"), output("2"), user("c")]
    assert cut_points(items) == [0, 6]


def test_split_keeps_system_messages_and_preserves_the_newest_turns_that_fit() -> None:
    system = Message("developer", (InputText("be brief"),))
    turns = [user("x" * 50), assistant("y" * 50), user("z" * 10), assistant("w" * 10), user("q")]
    parts = split([system, *turns], keep_tokens=25, count=chars)
    assert parts.kept == (system,)
    assert parts.preserved == tuple(turns[2:])  # 21 characters fit; the 121 before do not
    assert parts.summarised == tuple(turns[:2])


def test_split_always_preserves_the_last_user_message() -> None:
    turns = [user("a"), assistant("b"), user("c" * 100)]
    parts = split(turns, keep_tokens=1, count=chars)
    assert parts.preserved == (turns[2],)


def test_split_never_separates_a_call_from_its_output() -> None:
    turns = [user("a" * 40), call("1"), output("1"), assistant("b"), user("c")]
    # Cutting before the output would fit too, but the cuts are before `b` and `c` only.
    parts = split(turns, keep_tokens=len("sunny") + 3, count=chars)
    assert parts.preserved == (turns[3], turns[4])


def test_split_summarises_something_even_when_everything_fits() -> None:
    turns = [user("a"), assistant("b"), user("c")]
    parts = split(turns, keep_tokens=10_000, count=chars)
    assert parts.summarised == tuple(turns[:2])


def test_split_with_nothing_before_the_last_user_message_is_refused() -> None:
    with pytest.raises(ContextLengthExceeded):
        split([user("only")], keep_tokens=10, count=chars)
    with pytest.raises(ContextLengthExceeded):
        split([assistant("no user at all")], keep_tokens=10, count=chars)


def test_a_history_is_summarisable_with_a_complete_turn_before_its_last_user_message() -> None:
    assert summarisable([user("a"), assistant("b"), user("c")])
    assert summarisable([user("a"), call("1"), output("1"), user("c")])
    assert not summarisable([user("only")])
    assert not summarisable([assistant("no user at all")])
    assert not summarisable([user("a"), call("1")])  # the call waits for its output
