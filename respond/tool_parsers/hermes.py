"""The Hermes/Qwen form: `<tool_call>{"name": …, "arguments": {…}}</tool_call>`.

Text outside the tags passes through as it arrives; a call's argument text streams out
while it is generated, and the parse at its closing tag (or at the end of generation)
is authoritative. A call cut short by the token budget is dropped, never shown as text
(its markup is unmistakable). Subclasses may read another body between the same tags.
"""

from __future__ import annotations

from dataclasses import dataclass

from mlxcel.respond.tool_parsers.base import JsonCall, ParserBase, Schemas
from mlxcel.respond.tool_parsers.events import ParseEvent, partial_suffix

OPEN = "<tool_call>"
CLOSE = "</tool_call>"


@dataclass
class TaggedCall(JsonCall):
    raw: str = ""
    """The text between the tags so far."""


class HermesToolParser(ParserBase):
    def __init__(self, names: frozenset[str], parameters: Schemas | None = None) -> None:
        super().__init__(names, parameters)
        self._buffer = ""
        self._call: TaggedCall | None = None
        self._cut = False  # generation ended at its token budget

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
                self._call = TaggedCall()
            end = self._buffer.find(CLOSE)
            if end < 0:
                keep = partial_suffix(self._buffer, CLOSE)
                self._call.raw += self._buffer[: len(self._buffer) - keep]
                self._buffer = self._buffer[len(self._buffer) - keep :]
                return events + self._stream_call(self._call)
            self._call.raw += self._buffer[:end]
            self._buffer = self._buffer[end + len(CLOSE) :]
            events += self._close(self._call, closed=True)
            self._call = None

    def finish(self, *, cut: bool = False) -> list[ParseEvent]:
        events: list[ParseEvent] = []
        self._cut = cut
        if self._call is not None:  # generation ended inside a call
            self._call.raw += self._buffer
            self._buffer = ""
            events += self._close(self._call, closed=False)
            self._call = None
        events += self._emit_text(self._buffer)
        self._buffer = ""
        return events

    def _stream_call(self, call: TaggedCall) -> list[ParseEvent]:
        """Events for the call's body so far (its closing tag not yet seen)."""
        return self._stream_json(call, call.raw)

    def _close(self, call: TaggedCall, *, closed: bool) -> list[ParseEvent]:
        """Settle the call: `closed` when its closing tag came (not the end of text)."""
        return self._settle_json(call, call.raw, self._markup(call, closed=closed))

    def _markup(self, call: TaggedCall, *, closed: bool) -> str:
        """The text a call that does not parse becomes: none for one the token budget
        cut short, which is a call unfinished rather than text."""
        if self._cut and not closed:
            return ""
        return OPEN + call.raw + (CLOSE if closed else "")
