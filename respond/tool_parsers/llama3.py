"""The Llama 3 JSON form: a reply that is `{"name": …, "parameters": {…}}`.

The call may follow `<|python_tag|>` ("arguments" is taken for "parameters" too), and
several may follow one another, separated by `;`. A reply is held only while it may
still be a call: when it starts, after optional spaces, with `{` or `<|python_tag|>`;
any other reply passes through as it arrives (a later `<|python_tag|>` still starts
calls). A call opens once its offered name is read, and its arguments stream.
"""

from __future__ import annotations

from typing import Literal

from mlxcel.respond.tool_parsers.base import JsonCall, Schemas
from mlxcel.respond.tool_parsers.events import ParseEvent
from mlxcel.respond.tool_parsers.runs import RunParser

PYTHON_TAG = "<|python_tag|>"

_State = Literal["start", "text", "call", "object", "after"]
"""`call`: a call must follow (after the tag or `;`); `after`: one may follow."""


class Llama3JsonToolParser(RunParser):
    def __init__(self, names: frozenset[str], parameters: Schemas | None = None) -> None:
        super().__init__(names, parameters)
        self._state: _State = "start"

    def _step(self, events: list[ParseEvent], *, final: bool) -> bool:
        if self._state == "text":
            if not self._text(PYTHON_TAG, events, final=final):
                return False
            self._state = "call"
            return True
        if self._state == "object":
            if self._object(events, final=final):
                self._state = "after"
                return True
            return False
        rest = self._buffer.lstrip()
        space = len(self._buffer) - len(rest)
        match self._state:
            case _ if rest.startswith(PYTHON_TAG):
                self._take(space + len(PYTHON_TAG))
                self._state = "call"
            case _ if PYTHON_TAG.startswith(rest) and not final:
                return False  # nothing yet, or the tag's beginning
            case _ if rest.startswith("{"):
                self._take(space)
                self._state = "object"
                self._begin(JsonCall())
            case "after" if rest.startswith(";"):
                self._take(space + 1)
                self._state = "call"
            case "start":
                self._state = "text"
            case _:
                events += self._end_run(final=final)
                self._state = "text"
        return True
