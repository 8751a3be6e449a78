"""JSON in text that is still arriving: where an object ends, and a call's head.

The parsers that stream JSON arguments need to know how far an object certainly
reaches before it is complete; `ObjectScanner` answers that incrementally, keeping its
string and bracket state between calls so each character is read once.
"""

from __future__ import annotations

import json
import math
import re
from typing import Any

CALL_HEAD = re.compile(
    r'\s*\{\s*(?:"type"\s*:\s*"function"\s*,\s*)?"name"\s*:\s*"((?:[^"\\]|\\.)*)"'
    r'\s*,\s*"(?:arguments|parameters)"\s*:\s*'
)
"""A JSON call object up to its argument value: `{"name": "…", "arguments": `."""

MAX_DEPTH = 64
"""Deepest bracket nesting read as JSON: deeper text is not a call (Python's reader
and writer recurse, and would raise on it)."""

_STRING = re.compile(r'"(?:[^"\\]|\\.)*"?', re.DOTALL)
_NOT_BRACKET = re.compile(r"[^\[\]{}]+")


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


def loads(text: str) -> Any:
    """`text` as strict JSON (no NaN or infinities); ValueError when it is not, or when
    it nests deeper than `MAX_DEPTH`."""
    if too_deep(text):
        raise ValueError("JSON nested too deeply")
    try:
        return json.loads(text, parse_constant=_reject, parse_float=_finite)
    except RecursionError:
        raise ValueError("JSON nested too deeply") from None


def dumps(value: Any) -> str:
    """`value` as JSON text that encodes to UTF-8 (lone surrogates stay escaped)."""
    text = json.dumps(value, ensure_ascii=False, allow_nan=False)
    try:
        text.encode()
    except UnicodeEncodeError:
        return json.dumps(value, allow_nan=False)
    return text


def too_deep(text: str) -> bool:
    """Whether brackets outside JSON strings nest deeper than `MAX_DEPTH`."""
    depth = 0
    for c in _NOT_BRACKET.sub("", _STRING.sub("", text)):
        depth += 1 if c in "[{" else -1
        if depth > MAX_DEPTH:
            return True
    return False


def json_string(body: str) -> str | None:
    """The value of a JSON string literal's body (between its quotes), if valid."""
    try:
        value: Any = loads(f'"{body}"')
    except ValueError:
        return None
    return value if isinstance(value, str) else None


def json_object(text: str) -> dict[str, Any] | None:
    """`text` as a JSON object, or None when it is not one."""
    try:
        value: Any = loads(text)
    except ValueError:
        return None
    return value if isinstance(value, dict) else None


def _reject(constant: str) -> Any:
    """JSON has no NaN or infinities, though Python's reader takes them."""
    raise ValueError(constant)


def _finite(text: str) -> float:
    """A number too large for a float would be read as an infinity."""
    value = float(text)
    if not math.isfinite(value):
        raise ValueError(text)
    return value
