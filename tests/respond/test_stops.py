"""Stop strings found while text streams: nothing of one is ever released."""

from __future__ import annotations

import pytest

from mlxcel.respond.stops import StopScanner


def run(stops: list[str], pieces: list[str]) -> tuple[list[str], bool, str]:
    scanner = StopScanner(stops)
    out = [scanner.feed(piece) for piece in pieces]
    return out, scanner.found, scanner.finish()


def test_without_stops_text_passes_through() -> None:
    assert run([], ["a", "b"]) == (["a", "b"], False, "")


def test_a_stop_inside_one_piece_cuts_it() -> None:
    assert run(["fox"], ["the fox jumps", " more"]) == (["the ", ""], True, "")


def test_a_stop_across_pieces_is_held_back_then_dropped() -> None:
    assert run(["brown fox"], ["the bro", "wn f", "ox!"]) == (["the ", "", ""], True, "")


def test_a_false_start_is_released_when_it_cannot_be_a_stop() -> None:
    assert run(["fox"], ["the fo", "rest"]) == (["the ", "forest"], False, "")


def test_held_text_is_released_at_the_end() -> None:
    assert run(["fox"], ["a f"]) == (["a "], False, "f")


@pytest.mark.parametrize("stops", [["xyz", "b"], ["b", "xyz"]])
def test_the_earliest_stop_wins(stops: list[str]) -> None:
    assert run(stops, ["a b xyz"]) == (["a "], True, "")
