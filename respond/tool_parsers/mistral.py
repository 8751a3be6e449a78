"""The Mistral forms, both introduced by `[TOOL_CALLS]`.

Newer models write `[TOOL_CALLS]name[ARGS]{…}` (some with `[CALL_ID]id` before
`[ARGS]`), either each call with its own `[TOOL_CALLS]` or several `name[ARGS]{…}` after
one; older ones write a JSON list, `[TOOL_CALLS][{"name": …, "arguments": {…}}, …]`.
A call opens as soon as its offered name is read, and its arguments stream as they are
generated.
"""

from __future__ import annotations

import re
from typing import Literal

from mlxcel.respond.tool_parsers.base import Call, JsonCall, Schemas
from mlxcel.respond.tool_parsers.events import ParseEvent
from mlxcel.respond.tool_parsers.runs import RunParser

TOOL_CALLS = "[TOOL_CALLS]"
ARGS = "[ARGS]"
CALL_ID = "[CALL_ID]"
_NAME = re.compile(r"\s*([\w.-]*)\s*")
_CALL_ID_VALUE = re.compile(r"\s*[\w-]*\s*")

_State = Literal["text", "marker", "name", "arguments", "list", "object"]


class MistralToolParser(RunParser):
    def __init__(self, names: frozenset[str], parameters: Schemas | None = None) -> None:
        super().__init__(names, parameters)
        self._state: _State = "text"
        self._in_list = False  # the run is a JSON list, `[TOOL_CALLS][…]`

    def _step(self, events: list[ParseEvent], *, final: bool) -> bool:
        if self._state == "text":
            if not self._text(TOOL_CALLS, events, final=final):
                return False
            self._state = "marker"
            return True
        if self._state == "object":
            if self._object(events, final=final):
                in_list = isinstance(self._call, JsonCall) and self._in_list
                self._state = "list" if in_list else "name"
                return True
            return False
        rest = self._buffer.lstrip()
        space = len(self._buffer) - len(rest)
        match self._state:
            case "name":
                return self._name(events, rest, final=final)
            case _ if not rest:
                if not final:
                    return False
                events += self._drop() if self._state == "arguments" else self._end_run(final=True)
                self._state = "text"
            case "marker" if rest[0] in "[{":
                self._in_list = rest[0] == "["
                self._take(space + int(self._in_list))
                self._state = "list" if self._in_list else "object"
                self._begin(JsonCall())
            case "marker":
                self._state = "name"
            case "arguments" if rest[0] == "{":
                self._take(space)
                self._state = "object"
                self._begin(self._call)
            case "arguments":  # `[ARGS]` not followed by an object
                events += self._drop()
                self._state = "text"
            case "list" if rest[0] == ",":
                self._take(space + 1)
            case "list" if rest[0] == "]":
                self._take(space + 1)
                events += self._end_run(final=final)
                self._state = "name"  # another run may follow, or spaces that end the reply
            case "list" if rest[0] == "{":
                self._take(space)
                self._state = "object"
                self._begin(JsonCall())
            case "list":  # not a list of calls after all
                events += self._end_run(final=final)
                self._state = "text"
        return True

    def _name(self, events: list[ParseEvent], rest: str, *, final: bool) -> bool:
        """A `name[ARGS]` head, another `[TOOL_CALLS]`, or the end of the run."""
        if rest.startswith(TOOL_CALLS):
            self._take(len(self._buffer) - len(rest) + len(TOOL_CALLS))
            self._state = "marker"
            return True
        head = _name_head(self._buffer)
        if isinstance(head, tuple):
            name, end = head
            self._take(end)
            self._call = Call()
            events += self._open(self._call, name)
            self._state = "arguments"
            return True
        if not final and (head or (rest and TOOL_CALLS.startswith(rest))):
            return False
        events += self._end_run(final=final)
        self._state = "text"
        return True


def _name_head(text: str) -> tuple[str, int] | bool:
    """`name[ARGS]` (or `name[CALL_ID]id[ARGS]`) at the front of `text`: (name, its
    end); True while `text` may still become one, False when it cannot."""
    name = _NAME.match(text)
    assert name is not None
    rest = text[name.end() :]
    if not rest:
        return True
    if not name.group(1):
        return False
    if rest.startswith(CALL_ID):
        value = _CALL_ID_VALUE.match(text, name.end() + len(CALL_ID))
        assert value is not None
        rest = text[value.end() :]
        if rest.startswith(ARGS):
            return name.group(1), value.end() + len(ARGS)
        return ARGS.startswith(rest)
    if rest.startswith(ARGS):
        return name.group(1), name.end() + len(ARGS)
    return ARGS.startswith(rest) or CALL_ID.startswith(rest)
