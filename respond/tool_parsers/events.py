"""What a tool-call parser reports, and the JSON call forms its parsers share.

A parser turns generated text into events: text outside calls (`TextPiece`), and each
call as it is opened, streamed, and closed, or dropped when it turns out not to parse.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from mlxcel.respond.tool_parsers.json_scan import dumps, loads

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
    """(name, arguments JSON) when `text` is one JSON call to an offered tool.

    Anything else is not a call: a name that is not a string, arguments that are not an
    object (or a string holding one), text that is not JSON or nests too deeply."""
    try:
        value = loads(text)
    except ValueError:
        return None
    name = value.get("name") if isinstance(value, dict) else None
    if not isinstance(name, str) or name not in names:
        return None
    arguments: Any = value.get("arguments", value.get("parameters", {}))
    if isinstance(arguments, str):
        try:
            arguments = loads(arguments)
        except ValueError:
            return None
    if not isinstance(arguments, dict):
        return None
    return name, dumps(arguments)


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
