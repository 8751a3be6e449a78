"""Calls in runs of markup read from a buffer one step at a time (Mistral, Llama 3).

Between calls sits markup (a marker, list brackets, separators). It is dropped when the
call next to it parses and becomes text with a call that does not, so text never shows
the markup of parsed calls and always shows that of the rest.
"""

from __future__ import annotations

from abc import ABC, abstractmethod

from mlxcel.respond.tool_parsers.base import Call, JsonCall, ParserBase, Schemas
from mlxcel.respond.tool_parsers.events import ParseEvent, partial_suffix
from mlxcel.respond.tool_parsers.json_scan import ObjectScanner, json_object


class RunParser(ParserBase, ABC):
    def __init__(self, names: frozenset[str], parameters: Schemas | None = None) -> None:
        super().__init__(names, parameters)
        self._buffer = ""
        self._markup = ""
        """Markup read since the last call settled."""
        self._parsed_last = False
        """The run's last call parsed, so markup after it is dropped."""
        self._call = Call()
        self._scanner = ObjectScanner(0)

    def feed(self, text: str) -> list[ParseEvent]:
        self._buffer += text
        events: list[ParseEvent] = []
        while self._step(events, final=False):
            pass
        return events

    def finish(self, *, cut: bool = False) -> list[ParseEvent]:
        # `cut` changes nothing here (see `ToolParser.finish`).
        events: list[ParseEvent] = []
        while self._step(events, final=True):
            pass
        return events

    @abstractmethod
    def _step(self, events: list[ParseEvent], *, final: bool) -> bool:
        """Read what the buffer allows; False when nothing more can be read yet.

        `final`: the buffer holds all that is left, so everything must be read."""

    def _text(self, marker: str, events: list[ParseEvent], *, final: bool) -> bool:
        """Let text through up to the `marker` that starts a run (the start of one is held
        until it is known); True once the marker is read into the markup."""
        start = self._buffer.find(marker)
        if start < 0:
            keep = 0 if final else partial_suffix(self._buffer, marker)
            events += self._emit_text(self._buffer[: len(self._buffer) - keep])
            self._buffer = self._buffer[len(self._buffer) - keep :]
            return False
        events += self._emit_text(self._buffer[:start])
        self._buffer = self._buffer[start:]
        self._take(len(marker))
        self._parsed_last = False
        return True

    def _take(self, size: int) -> None:
        """Move the buffer's first `size` characters into the markup."""
        self._markup += self._buffer[:size]
        self._buffer = self._buffer[size:]

    def _begin(self, call: Call) -> None:
        """`call`'s object starts at the front of the buffer (`Call`: its arguments)."""
        self._call, self._scanner = call, ObjectScanner(0)

    def _object(self, events: list[ParseEvent], *, final: bool) -> bool:
        """Read the object at the front; True once it is settled, as a call or as text."""
        end = self._scanner.scan(self._buffer)
        if end is None and final:
            self._take(len(self._buffer))
            events += self._drop()
            return True
        if end is None:
            if isinstance(self._call, JsonCall):
                events += self._stream_json(self._call, self._buffer)
            else:
                events += self._stream(self._call, self._buffer)
            return False
        raw = self._buffer[:end]
        self._take(end)
        if isinstance(self._call, JsonCall):
            events += self._settle_json(self._call, raw, self._markup)
        else:
            name = self._call.name
            parsed = (name, raw) if name is not None and json_object(raw) is not None else None
            events += self._settle(self._call, parsed, self._markup, raw)
        self._markup, self._parsed_last = "", self._call.parsed
        return True

    def _drop(self) -> list[ParseEvent]:
        """The current call does not parse: its markup becomes text."""
        events = self._settle(self._call, None, self._markup)
        self._markup, self._parsed_last = "", False
        return events

    def _end_run(self, *, final: bool) -> list[ParseEvent]:
        """The run of calls is over: its markup is text unless its last call parsed
        (then spaces that end the reply are dropped with it)."""
        markup, self._markup = self._markup, ""
        if self._parsed_last:
            if final and not self._buffer.strip():
                self._buffer = ""
            return []
        return self._emit_text(markup)
