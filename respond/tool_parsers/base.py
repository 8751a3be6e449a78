"""What every tool-call parser shares: the text it lets through and the calls it reports.

A call is reported (`CallOpened`) once its tool's name is known to be offered, its
argument text streams while it is generated, and the parse at its end is authoritative:
`_settle` either closes it, keeping the streamed text as a prefix of the final arguments,
or turns its markup back into text (`CallDropped` first when it had been opened).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from mlxcel.respond.tool_parsers.events import (
    CallArguments,
    CallClosed,
    CallDropped,
    CallOpened,
    ParseEvent,
    TextPiece,
    parse_call,
)
from mlxcel.respond.tool_parsers.json_scan import (
    CALL_HEAD,
    ObjectScanner,
    argument_text,
    json_string,
    loads,
)

Schemas = Mapping[str, Mapping[str, Any]]
"""Tool name to its JSON-schema `parameters` object."""


@dataclass
class Call:
    """A call being read. `name` is set once it has been reported (`CallOpened`)."""

    name: str | None = None
    index: int = 0
    streamed: str = ""
    """The argument text reported so far."""
    parsed: bool = False
    """Set when the call closed as a call (not as text)."""


@dataclass
class JsonCall(Call):
    """A `{"name": …, "arguments": {…}}` object being read."""

    start: int = -1
    """Where the argument value begins in the object's text, once the head is read."""
    arguments: ObjectScanner | None = None
    """Scans the argument value when it is an object (only objects stream)."""


class ParserBase:
    def __init__(self, names: frozenset[str], parameters: Schemas | None = None) -> None:
        self.names = names
        self.parameters: Schemas = parameters or {}
        self._outside: list[str] = []
        self._next_index = 0

    @property
    def text(self) -> str:
        """All text outside parsed calls (calls that did not parse included)."""
        return "".join(self._outside)

    def _emit_text(self, text: str) -> list[ParseEvent]:
        if not text:
            return []
        self._outside.append(text)
        return [TextPiece(text)]

    def _open(self, call: Call, name: str) -> list[ParseEvent]:
        """Report the call, if `name` is an offered tool; it takes the next index."""
        if call.name is not None or name not in self.names:
            return []
        call.name, call.index = name, self._next_index
        self._next_index += 1
        return [CallOpened(call.index, name)]

    def _stream(self, call: Call, arguments: str) -> list[ParseEvent]:
        """Report what `arguments` (the argument text certain so far) adds."""
        if call.name is None or not arguments.startswith(call.streamed):
            return []
        delta, call.streamed = arguments[len(call.streamed) :], arguments
        return [CallArguments(call.index, delta)] if delta else []

    def _settle(
        self, call: Call, parsed: tuple[str, str] | None, markup: str, raw: str = ""
    ) -> list[ParseEvent]:
        """Close `call` as `parsed` (name, arguments), or turn its `markup` into text.

        `raw` is the model's own argument text: it is kept as the arguments when it is
        the same object, so what was streamed stays their prefix."""
        events: list[ParseEvent] = []
        if parsed is not None and parsed[0] not in self.names:
            parsed = None  # only offered tools are called
        if call.name is not None and (parsed is None or parsed[0] != call.name):
            events.append(CallDropped(call.index))
            call.name, call.streamed = None, ""
        if parsed is None:
            return events + self._emit_text(markup)
        name, arguments = parsed
        if raw.startswith(call.streamed) and _same_json(raw, arguments):
            arguments = raw
        events += self._open(call, name)
        events += self._stream(call, arguments)
        call.parsed = True
        return [*events, CallClosed(call.index, name, arguments)]

    def _stream_json(self, call: JsonCall, text: str) -> list[ParseEvent]:
        """Open a JSON call once its head is read, then stream its argument object.

        `text` is the call object so far; it only grows between calls."""
        events: list[ParseEvent] = []
        if call.start < 0:
            head = CALL_HEAD.match(text)
            # Wait for the value's first character, so the head's spaces are all seen.
            if head is None or head.end() == len(text):
                return events
            call.start = head.end()
            if text[call.start] == "{":
                call.arguments = ObjectScanner(call.start)
            events += self._open(call, json_string(head.group(1)) or "")
        if call.arguments is None:
            return events
        end = call.arguments.scan(text)
        return events + self._stream(call, text[call.start : end])

    def _settle_json(self, call: JsonCall, text: str, markup: str) -> list[ParseEvent]:
        """Settle a JSON call whose object text is `text` (surrounding spaces allowed)."""
        parsed = parse_call(text.strip(), self.names)
        return self._settle(call, parsed, markup, argument_text(text))


def _same_json(a: str, b: str) -> bool:
    try:
        return bool(loads(a) == loads(b))
    except ValueError:
        return False
