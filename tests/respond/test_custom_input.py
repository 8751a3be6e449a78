"""A custom tool's input decoded from its JSON arguments while they stream."""

from __future__ import annotations

import itertools
import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from mlxcel.items import custom_input
from mlxcel.respond.custom_input import InputDecoder


def fed(arguments: str, cuts: list[int]) -> str:
    decoder = InputDecoder()
    bounds = [0, *sorted({c % (len(arguments) + 1) for c in cuts}), len(arguments)]
    return "".join(decoder.feed(arguments[a:b]) for a, b in itertools.pairwise(bounds))


@given(
    st.text(),
    st.booleans(),
    st.sampled_from([None, 2]),
    st.lists(st.integers(min_value=0), max_size=30),
)
def test_any_input_streams_whole_however_the_arguments_are_cut(
    text: str, ascii_only: bool, indent: int | None, cuts: list[int]
) -> None:
    arguments = json.dumps({"input": text}, ensure_ascii=ascii_only, indent=indent)
    assert fed(arguments, cuts) == text == custom_input(arguments)


@given(st.text(), st.integers(min_value=0))
def test_cut_off_arguments_stream_a_prefix(text: str, cut: int) -> None:
    arguments = json.dumps({"input": text})
    assert text.startswith(fed(arguments[: cut % (len(arguments) + 1)], []))


@pytest.mark.parametrize(
    ("arguments", "streamed"),
    [
        ('{"patch": "x"}', ""),
        ('{"input": 5}', ""),
        ('"x"', ""),
        ("[1]", ""),
        ('not json "input"', ""),
        ('{"input": "a\\q b"}', "a"),  # a bad escape stops the stream where it stands
        ('{"input": "ok" , "more": "x"}', "ok"),  # the string's end is the input's end
    ],
)
def test_other_shapes_stream_no_more_than_they_are(arguments: str, streamed: str) -> None:
    assert fed(arguments, list(range(len(arguments)))) == streamed
