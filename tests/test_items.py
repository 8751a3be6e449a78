"""The plain records every layer speaks."""

from __future__ import annotations

from mlxcel.items import RequestEcho


def test_echo_defaults_are_not_shared_between_instances() -> None:
    first, second = RequestEcho(model="m"), RequestEcho(model="m")
    assert first.text == second.text == {"format": {"type": "text"}}
    assert first.text is not second.text
