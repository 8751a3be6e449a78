"""Forms parsed once, at the end of generation: Functionary's and the pythonic one.

Functionary (v3.1) writes `<function=NAME>{…}</function>` (the closing tag may be
missing); Llama 3.2/4 style models write a Python list of calls with keyword arguments,
`[get_weather(city="Paris"), f(a=1)]`, read with `ast` (literal values only). Text
passes through until a call to an offered tool may begin; from one that certainly
begins, everything is held and parsed at the end. Spaces between or after parsed calls
are dropped; whatever does not parse is text.
"""

from __future__ import annotations

import ast
import itertools
import re
import tokenize
from abc import ABC, abstractmethod
from typing import Any

from mlxcel.respond.tool_parsers.base import Call, ParserBase, Schemas
from mlxcel.respond.tool_parsers.events import ParseEvent, partial_suffix
from mlxcel.respond.tool_parsers.json_scan import ObjectScanner, dumps, json_object, too_deep

_FUNCTION_END = re.compile(r"\s*</function>")
_SPACE = re.compile(r"\s*")
_LITERAL_ERRORS = (ValueError, TypeError, SyntaxError, MemoryError, RecursionError)


class EndParser(ParserBase, ABC):
    _OPENER: str
    """How every call begins."""
    _HEAD: re.Pattern[str]
    """A call's beginning: group 1 the tool's name, group 2 what follows a whole name."""

    def __init__(self, names: frozenset[str], parameters: Schemas | None = None) -> None:
        super().__init__(names, parameters)
        self._buffer = ""
        self._holding = False  # a call certainly begins in the buffer: hold all till the end

    def feed(self, text: str) -> list[ParseEvent]:
        self._buffer += text
        if self._holding:
            return []
        start = len(self._buffer) - partial_suffix(self._buffer, self._OPENER)
        for head in self._HEAD.finditer(self._buffer):
            name, whole = head.group(1), head.group(2) is not None
            if whole and name in self.names:
                start, self._holding = head.start(), True
                break
            growing = not whole and head.end() == len(self._buffer)
            if growing and any(n.startswith(name) for n in self.names):
                start = head.start()  # may still become one
                break
        events = self._emit_text(self._buffer[:start])
        self._buffer = self._buffer[start:]
        return events

    def finish(self, *, cut: bool = False) -> list[ParseEvent]:
        # `cut` changes nothing here (see `ToolParser.finish`).
        text, self._buffer = self._buffer, ""
        events: list[ParseEvent] = []
        pos = search = 0
        called = False  # the last thing read was a parsed call
        while (head := self._HEAD.search(text, search)) is not None:
            search = head.start() + 1
            calls = None
            if head.group(2) is not None and head.group(1) in self.names:
                calls = self._read(text, head)
            if calls is None:
                continue
            gap = text[pos : head.start()]
            events += self._emit_text("" if called and not gap.strip() else gap)
            for name, arguments in calls[0]:
                events += self._settle(Call(), (name, arguments), "")
            pos = search = calls[1]
            called = True
        rest = text[pos:]
        return events + self._emit_text("" if called and not rest.strip() else rest)

    @abstractmethod
    def _read(self, text: str, head: re.Match[str]) -> tuple[list[tuple[str, str]], int] | None:
        """The calls beginning at `head` as (name, arguments JSON), and where they end;
        None when what begins there does not parse."""


class FunctionaryToolParser(EndParser):
    _OPENER = "<function="
    _HEAD = re.compile(r"<function=([\w.-]*)(>)?")

    def _read(self, text: str, head: re.Match[str]) -> tuple[list[tuple[str, str]], int] | None:
        space = _SPACE.match(text, head.end())
        assert space is not None
        start = space.end()
        end = ObjectScanner(start).scan(text) if text.startswith("{", start) else None
        arguments = json_object(text[start:end]) if end is not None else None
        if end is None or arguments is None:
            return None
        closing = _FUNCTION_END.match(text, end)
        call = (head.group(1), dumps(arguments))
        return [call], closing.end() if closing else end


class PythonicToolParser(EndParser):
    _OPENER = "["
    _HEAD = re.compile(r"\[\s*([A-Za-z_]\w*|)\s*(\()?")

    def __init__(self, names: frozenset[str], parameters: Schemas | None = None) -> None:
        super().__init__(names, parameters)
        self._text = ""
        self._ends: dict[int, int | None] = {}
        """Where brackets in `_text` close (see `_list_ends`)."""

    def _read(self, text: str, head: re.Match[str]) -> tuple[list[tuple[str, str]], int] | None:
        if text is not self._text or head.start() not in self._ends:
            self._text, self._ends = text, _list_ends(text, head.start())
        end = self._ends.get(head.start())
        if end is None:
            return None
        try:
            tree = ast.parse(text[head.start() : end], mode="eval")
        except (SyntaxError, ValueError, RecursionError, MemoryError):
            return None
        calls = self._calls(tree.body)
        return (calls, end) if calls is not None else None

    def _calls(self, node: ast.expr) -> list[tuple[str, str]] | None:
        if not isinstance(node, ast.List) or not node.elts:
            return None
        calls: list[tuple[str, str]] = []
        for call in node.elts:
            if not isinstance(call, ast.Call) or call.args:
                return None
            if not isinstance(call.func, ast.Name) or call.func.id not in self.names:
                return None
            arguments: dict[str, Any] = {}
            for keyword in call.keywords:
                if keyword.arg is None:  # **mapping
                    return None
                try:
                    arguments[keyword.arg] = ast.literal_eval(keyword.value)
                except _LITERAL_ERRORS:
                    return None
            try:
                arguments_text = dumps(arguments)
            except (TypeError, ValueError, RecursionError):  # a set, bytes, NaN, too deep
                return None
            if too_deep(arguments_text):
                return None
            calls.append((call.func.id, arguments_text))
        return calls


def _list_ends(text: str, start: int) -> dict[int, int | None]:
    """Where each bracket Python's tokenizer reads from `start` on closes: just past its
    `]` (None when it does not close, or closes another kind). One pass serves every
    call that begins at one of those brackets, so a long reply is read once, not at
    each `]` or each call."""
    lines = text[start:].splitlines(keepends=True)
    offsets = list(itertools.accumulate((len(line) for line in lines), initial=start))
    ends: dict[int, int | None] = {}
    stack: list[tuple[str, int]] = []
    try:
        for token in tokenize.generate_tokens(iter(lines).__next__):
            if token.type != tokenize.OP or token.string not in "()[]{}":
                continue
            row, column = token.start
            at = offsets[row - 1] + column
            if token.string in "([{":
                stack.append((token.string, at))
                ends[at] = None
            elif stack and stack[-1][0] + token.string in ("()", "[]", "{}"):
                ends[stack.pop()[1]] = at + 1
            else:
                stack.clear()  # what is open holds a stray closer: it is not Python
    except (tokenize.TokenError, SyntaxError, StopIteration):
        pass
    return ends
