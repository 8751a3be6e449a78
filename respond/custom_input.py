"""A custom tool's input decoded while its JSON arguments stream.

The model writes a custom tool's call as a function call whose arguments are
`{"input": "…"}`; `InputDecoder` turns each new piece of that JSON into the new characters
of the string, so the input streams as it is generated. Arguments of any other shape
stream nothing: the input is then sent whole when the call ends (`items.custom_input`,
whose parse is authoritative).
"""

from __future__ import annotations

import re

_OPENING = re.compile(r'\s*\{\s*"input"\s*:\s*"')
_COMPACT_OPENING = '{"input":"'
_SPECIAL = re.compile(r'["\\]')
_ESCAPES = {'"': '"', "\\": "\\", "/": "/", "b": "\b", "f": "\f", "n": "\n", "r": "\r", "t": "\t"}


class InputDecoder:
    """Feeds on argument text, answers the input's newly decoded characters."""

    def __init__(self) -> None:
        self._pending = ""  # text not decoded yet (an opening or an escape still arriving)
        self._inside = False  # the string's opening quote has been read
        self._stopped = False  # the string ended, or the arguments are not `{"input": "…"}`

    def feed(self, delta: str) -> str:
        if self._stopped:
            return ""
        self._pending += delta
        if not self._inside and not self._open():
            return ""
        return self._decode()

    def _open(self) -> bool:
        found = _OPENING.match(self._pending)
        if found is not None:
            self._pending = self._pending[found.end() :]
            self._inside = True
            return True
        compact = re.sub(r"\s", "", self._pending)
        self._stopped = not _COMPACT_OPENING.startswith(compact)
        return False

    def _decode(self) -> str:
        text, out, at = self._pending, [], 0
        while at < len(text):
            special = _SPECIAL.search(text, at)
            end = len(text) if special is None else special.start()
            out.append(text[at:end])
            at = end
            if at == len(text):
                break
            if text[at] == '"':
                self._stopped = True  # the string ended
                break
            char, width = _escape(text, at)
            if width == 0:
                break  # the escape is still arriving
            if char is None:
                self._stopped = True  # not JSON: left to the parse at the end
                break
            out.append(char)
            at += width
        self._pending = text[at:]
        return "".join(out)


def _escape(text: str, at: int) -> tuple[str | None, int]:
    """The escape at `text[at]` (a backslash) and its width; width 0: incomplete;
    None: malformed."""
    if at + 1 >= len(text):
        return None, 0
    kind = text[at + 1]
    if kind != "u":
        return _ESCAPES.get(kind), 2
    if at + 6 > len(text):
        return None, 0
    code = _hex(text[at + 2 : at + 6])
    if code is None or 0xDC00 <= code < 0xE000:
        return None, 6
    if code < 0xD800 or code >= 0xDC00:
        return chr(code), 6
    if at + 12 > len(text):  # a high surrogate: its low half follows
        return None, 0
    low = _hex(text[at + 8 : at + 12]) if text[at + 6 : at + 8] == "\\u" else None
    if low is None or not 0xDC00 <= low < 0xE000:
        return None, 12
    return chr(0x10000 + ((code - 0xD800) << 10) + (low - 0xDC00)), 12


def _hex(digits: str) -> int | None:
    if len(digits) != 4 or not all(c in "0123456789abcdefABCDEF" for c in digits):
        return None
    return int(digits, 16)
