"""Tool calls in generated text: found while streaming, settled at the end.

`HermesToolParser` reads the Hermes/Qwen form, `<tool_call>{"name": …, "arguments": …}
</tool_call>`, as text arrives: text outside the tags passes through, and a call's
argument text streams out while it is generated. The parse at the end is authoritative:
a call that does not parse becomes text again, and a reply that is nothing but a bare or
fenced JSON call to one of the offered tools (what small models often write instead of
the tags) becomes a call.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any

OPEN = "<tool_call>"
CLOSE = "</tool_call>"
_HEAD = re.compile(r'\s*\{\s*"name"\s*:\s*"((?:[^"\\]|\\.)*)"\s*,\s*"arguments"\s*:\s*')
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


@dataclass
class _Call:
    index: int
    raw: str = ""
    name: str | None = None
    start: int = 0
    """Where the argument value begins in `raw`."""
    sent: int = 0
    """How much of `raw` has been streamed as argument text."""


@dataclass
class HermesToolParser:
    names: frozenset[str]
    calls: int = 0
    _buffer: str = ""
    _call: _Call | None = None
    _text: list[str] = field(default_factory=list)
    _failed: list[str] = field(default_factory=list)

    def feed(self, text: str) -> list[ParseEvent]:
        self._buffer += text
        events: list[ParseEvent] = []
        while True:
            if self._call is None:
                start = self._buffer.find(OPEN)
                if start < 0:
                    keep = partial_suffix(self._buffer, OPEN)
                    events += self._emit_text(self._buffer[: len(self._buffer) - keep])
                    self._buffer = self._buffer[len(self._buffer) - keep :]
                    return events
                events += self._emit_text(self._buffer[:start])
                self._buffer = self._buffer[start + len(OPEN) :]
                self._call = _Call(self.calls)
                self.calls += 1
            end = self._buffer.find(CLOSE)
            if end < 0:
                keep = partial_suffix(self._buffer, CLOSE)
                self._call.raw += self._buffer[: len(self._buffer) - keep]
                self._buffer = self._buffer[len(self._buffer) - keep :]
                events += self._stream_call(self._call)
                return events
            self._call.raw += self._buffer[:end]
            self._buffer = self._buffer[end + len(CLOSE) :]
            events += self._close(self._call)
            self._call = None

    def finish(self) -> list[ParseEvent]:
        events: list[ParseEvent] = []
        if self._call is not None:  # generation ended inside a call
            self._call.raw += self._buffer
            self._buffer = ""
            events += self._close(self._call)
            self._call = None
        events += self._emit_text(self._buffer)
        self._buffer = ""
        return events

    @property
    def text(self) -> str:
        """All text outside calls (and calls that did not parse)."""
        return "".join(self._text)

    def _emit_text(self, text: str) -> list[ParseEvent]:
        if not text:
            return []
        self._text.append(text)
        return [TextPiece(text)]

    def _stream_call(self, call: _Call) -> list[ParseEvent]:
        events: list[ParseEvent] = []
        if call.name is None:
            head = _HEAD.match(call.raw)
            # Wait for the value's first character, so the head's spaces are all seen.
            if head is None or head.end() == len(call.raw):
                return events
            if json.loads(f'"{head.group(1)}"') not in self.names:
                return events
            call.name = json.loads(f'"{head.group(1)}"')
            call.start = call.sent = head.end()
            events.append(CallOpened(call.index, call.name))
        # Stream the argument value as far as it is certainly part of it: up to where
        # its brackets close (the rest is the call object's closing brace).
        end = _value_end(call.raw, call.start)
        if end > call.sent:
            events.append(CallArguments(call.index, call.raw[call.sent : end]))
            call.sent = end
        return events

    def _close(self, call: _Call) -> list[ParseEvent]:
        parsed = parse_call(call.raw.strip(), self.names)
        if parsed is None:
            text = OPEN + call.raw + CLOSE
            dropped: list[ParseEvent] = [CallDropped(call.index)] if call.name else []
            return dropped + self._emit_text(text)
        name, arguments = parsed
        if call.name is not None:
            # Keep the model's own argument text, so what was streamed is its prefix.
            raw = call.raw[call.start : _value_end(call.raw, call.start)]
            if _is_object(raw):
                arguments = raw
        events = [] if call.name else [CallOpened(call.index, name)]
        return [*events, CallClosed(call.index, name, arguments)]


def fallback_call(text: str, names: frozenset[str]) -> tuple[str, str] | None:
    """A reply that is only a bare or fenced JSON call to an offered tool."""
    stripped = text.strip()
    fenced = _FENCE.match(stripped)
    return parse_call(fenced.group(1) if fenced else stripped, names)


def _is_object(text: str) -> bool:
    try:
        return isinstance(json.loads(text), dict)
    except ValueError:
        return False


def partial_suffix(text: str, marker: str) -> int:
    """Length of the longest end of `text` that could begin `marker`."""
    for size in range(min(len(marker) - 1, len(text)), 0, -1):
        if marker.startswith(text[-size:]):
            return size
    return 0


def _value_end(raw: str, start: int) -> int:
    """Where the JSON value starting at `start` ends, or how far it certainly reaches.

    Scanned from the value's start each time (arguments are short), so string and
    bracket state is always right."""
    depth = 0
    in_string = escaped = False
    for i in range(start, len(raw)):
        c = raw[i]
        if in_string:
            if escaped:
                escaped = False
            elif c == "\\":
                escaped = True
            elif c == '"':
                in_string = False
        elif c == '"':
            in_string = True
        elif c in "{[":
            depth += 1
        elif c in "}]":
            depth -= 1
            if depth == 0:
                return i + 1
            if depth < 0:
                return i
    return len(raw)
