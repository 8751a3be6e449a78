"""What a tool-call parser reports, and the JSON call forms its parsers share.

A parser turns generated text into events: text outside calls (`TextPiece`), and each
call as it is opened, streamed, and closed, or dropped when it turns out not to parse.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

_FENCE = re.compile(r"^```(?:json)?\s*(.*?)\s*```$", re.DOTALL)


@dataclass(frozen=True, slots=True)
class TextPiece:
    text: str


@dataclass(frozen=True, slots=True)
class CallOpened:
    index: int
    name: str


@dataclass(frozen=True, slots=True)
class CallArguments:
    index: int
    delta: str


@dataclass(frozen=True, slots=True)
class CallClosed:
    """The authoritative call: `arguments` is a JSON object as text."""

    index: int
    name: str
    arguments: str


@dataclass(frozen=True, slots=True)
class CallDropped:
    """A streamed call that did not parse; its text is in the final message instead."""

    index: int


ParseEvent = TextPiece | CallOpened | CallArguments | CallClosed | CallDropped


def parse_call(text: str, names: frozenset[str]) -> tuple[str, str] | None:
    """(name, arguments JSON) when `text` is one JSON call to an offered tool."""
    try:
        value = json.loads(text)
    except ValueError:
        return None
    if not isinstance(value, dict) or value.get("name") not in names:
        return None
    arguments: Any = value.get("arguments", value.get("parameters", {}))
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments)
        except ValueError:
            return None
    if not isinstance(arguments, dict):
        return None
    return str(value["name"]), json.dumps(arguments, ensure_ascii=False)


def fallback_call(text: str, names: frozenset[str]) -> tuple[str, str] | None:
    """A reply that is only a bare or fenced JSON call to an offered tool."""
    stripped = text.strip()
    fenced = _FENCE.match(stripped)
    return parse_call(fenced.group(1) if fenced else stripped, names)


def partial_suffix(text: str, marker: str) -> int:
    """Length of the longest end of `text` that could begin `marker`."""
    for size in range(min(len(marker) - 1, len(text)), 0, -1):
        if marker.startswith(text[-size:]):
            return size
    return 0
