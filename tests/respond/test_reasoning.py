"""Splitting `<think>` traces from answers, piece by piece."""

from __future__ import annotations

import pytest

from mlxcel.respond.reasoning import AnswerPiece, ReasoningPiece, ReasoningSplitter


def split(chunks: list[str], *, opened: bool = False) -> tuple[str, str]:
    splitter = ReasoningSplitter(opened=opened)
    pieces = [p for c in chunks for p in splitter.feed(c)] + splitter.finish()
    reasoning = "".join(p.text for p in pieces if isinstance(p, ReasoningPiece))
    answer = "".join(p.text for p in pieces if isinstance(p, AnswerPiece))
    return reasoning, answer


@pytest.mark.parametrize("size", [1, 2, 3, 5, 100])
def test_trace_at_the_start_in_any_pieces(size: int) -> None:
    text = "<think>\nplan: add 2 and 2\n</think>\n\nThe answer is 4."
    chunks = [text[i : i + size] for i in range(0, len(text), size)]
    assert split(chunks) == ("plan: add 2 and 2\n", "The answer is 4.")


def test_template_that_opens_the_trace() -> None:
    assert split(["thinking ", "hard</th", "ink>done"], opened=True) == ("thinking hard", "done")


def test_no_trace_and_think_later_is_text() -> None:
    assert split(["Hello <think>not a trace</think>"]) == ("", "Hello <think>not a trace</think>")
    assert split(["<thi", "s is text"]) == ("", "<this is text")


def test_unterminated_trace_stays_reasoning() -> None:
    assert split(["<think>never ends"]) == ("never ends", "")
