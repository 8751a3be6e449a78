"""JSON in text that is still arriving: where an object ends, and a call's head.

The parsers that stream JSON arguments need to know how far an object certainly
reaches before it is complete; `ObjectScanner` answers that incrementally, keeping its
string and bracket state between calls so each character is read once.
"""

from __future__ import annotations

import json
import re
from typing import Any

CALL_HEAD = re.compile(
    r'\s*\{\s*(?:"type"\s*:\s*"function"\s*,\s*)?"name"\s*:\s*"((?:[^"\\]|\\.)*)"'
    r'\s*,\s*"(?:arguments|parameters)"\s*:\s*'
)
"""A JSON call object up to its argument value: `{"name": "…", "arguments": `."""


class ObjectScanner:
    """Finds where the bracketed JSON value opening at `start` closes, as its text grows.

    The text passed to `scan` must only grow between calls (the same prefix each time).
    Brackets of either kind are counted together, and brackets in strings are skipped.
    """

    def __init__(self, start: int) -> None:
        self._pos = start
        self._depth = 0
        self._in_string = False
        self._escaped = False
        self._end: int | None = None

    def scan(self, text: str) -> int | None:
        """Just past the closing bracket, or None while the value is still open."""
        while self._end is None and self._pos < len(text):
            c = text[self._pos]
            self._pos += 1
            if self._in_string:
                if self._escaped:
                    self._escaped = False
                elif c == "\\":
                    self._escaped = True
                elif c == '"':
                    self._in_string = False
            elif c == '"':
                self._in_string = True
            elif c in "{[":
                self._depth += 1
            elif c in "}]":
                self._depth -= 1
                if self._depth <= 0:
                    self._end = self._pos
        return self._end


def argument_text(text: str) -> str:
    """The argument object's own text in a complete JSON call, or "" if there is none."""
    head = CALL_HEAD.match(text)
    if head is None or not text.startswith("{", head.end()):
        return ""
    end = ObjectScanner(head.end()).scan(text)
    return text[head.end() : end] if end is not None else ""


def json_string(body: str) -> str | None:
    """The value of a JSON string literal's body (between its quotes), if valid."""
    try:
        value: Any = json.loads(f'"{body}"')
    except ValueError:
        return None
    return value if isinstance(value, str) else None


def json_object(text: str) -> dict[str, Any] | None:
    """`text` as a JSON object, or None when it is not one."""
    try:
        value: Any = json.loads(text)
    except ValueError:
        return None
    return value if isinstance(value, dict) else None
