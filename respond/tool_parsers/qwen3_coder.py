"""The Qwen3-Coder XML form, turned into JSON arguments as it streams.

    <tool_call>
    <function=NAME>
    <parameter=KEY>
    VALUE
    </parameter>
    </function>
    </tool_call>

A value is typed by the tool's parameter schema: a string keeps its text (less the one
newline after the opening tag and before the closing one); other types are read as
JSON, falling back to the text. The call opens at `<function=NAME>`, each parameter
streams as `{"key": value` or `, "key": value` once it is complete, and `}` follows at
`</function>`, so the streamed text is exactly the final arguments. A value also ends
where the next `<parameter=` or `</function>` begins, and before `</tool_call>` the
closing tags may be missing. A body that is a JSON call is read as in the Hermes form.
The body is read again from its start as it grows, so no reading state is kept.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from mlxcel.respond.tool_parsers.events import ParseEvent
from mlxcel.respond.tool_parsers.hermes import HermesToolParser, TaggedCall
from mlxcel.respond.tool_parsers.json_scan import MAX_DEPTH, dumps, loads

_JSON_BODY = re.compile(r"\s*\{")
_FUNCTION = re.compile(r"\s*<function=([^>]*)>")
_PARAMETER = re.compile(r"\s*<parameter=([^>]*)>")
_FUNCTION_END = re.compile(r"\s*</function>")
_PARAMETER_END = "</parameter>"
_VALUE_ENDS = (_PARAMETER_END, "<parameter=", "</function>")


class Qwen3CoderToolParser(HermesToolParser):
    def _stream_call(self, call: TaggedCall) -> list[ParseEvent]:
        if _JSON_BODY.match(call.raw):
            return super()._stream_call(call)
        name, arguments, _ = self._read(call.raw, lenient=False)
        events = self._open(call, name) if name is not None else []
        return events + self._stream(call, arguments)

    def _close(self, call: TaggedCall, *, closed: bool) -> list[ParseEvent]:
        if _JSON_BODY.match(call.raw):
            return super()._close(call, closed=closed)
        name, arguments, complete = self._read(call.raw, lenient=closed)
        parsed = (name, arguments) if complete and name in self.names else None
        return self._settle(call, parsed, self._markup(call, closed=closed), arguments)

    def _read(self, body: str, *, lenient: bool) -> tuple[str | None, str, bool]:
        """(tool name, argument JSON so far, whether the body is a complete call).

        `lenient`: the body is all there is, so missing closing tags are implied."""
        head = _FUNCTION.match(body)
        if head is None:
            return None, "", False
        name = head.group(1).strip()
        members: list[str] = []
        pos = head.end()
        while (tag := _PARAMETER.match(body, pos)) is not None:
            bounds = _value_bounds(body, tag.end(), lenient=lenient)
            if bounds is None:  # the value is still arriving
                return name, _object(members, closed=False), False
            key, value = tag.group(1).strip(), body[tag.end() : bounds[0]]
            members.append(f"{dumps(key)}: {dumps(self._value(name, key, value))}")
            pos = bounds[1]
        end = _FUNCTION_END.match(body, pos)
        closed = end is not None or lenient
        complete = closed and not body[end.end() if end else pos :].strip()
        return name, _object(members, closed=closed), complete

    def _value(self, tool: str, key: str, text: str) -> Any:
        text = text.removeprefix("\n").removesuffix("\n")
        schemas: Any = self.parameters
        schema = schemas.get(tool) if isinstance(schemas, Mapping) else None
        types = _types(_property(schema, key))
        if text.strip() == "null" and "null" in types:
            return None
        if not types or "string" in types:
            return text
        try:
            return loads(text)
        except ValueError:
            return text


def _value_bounds(body: str, start: int, *, lenient: bool) -> tuple[int, int] | None:
    """(end of the value starting at `start`, where reading goes on), if it has ended."""
    found = [(i, marker) for marker in _VALUE_ENDS if (i := body.find(marker, start)) >= 0]
    if not found:
        return (len(body), len(body)) if lenient else None
    end, marker = min(found)
    return end, end + len(marker) if marker == _PARAMETER_END else end


def _object(members: list[str], *, closed: bool) -> str:
    """The argument object's text: nothing before its first member, `}` once closed."""
    text = "{" + ", ".join(members) if members else ""
    return (text or "{") + "}" if closed else text


def _property(schema: object, key: str) -> Mapping[str, Any]:
    """The schema of parameter `key`; empty when the tool's schema does not say (a tool's
    `parameters` may be anything the request sent)."""
    properties = schema.get("properties") if isinstance(schema, Mapping) else None
    found = properties.get(key) if isinstance(properties, Mapping) else None
    return found if isinstance(found, Mapping) else {}


def _types(schema: Mapping[str, Any], depth: int = 0) -> set[str]:
    """The JSON types a schema allows, from `type` and any `anyOf`/`oneOf` options
    (options nested deeper than `MAX_DEPTH` are not read)."""
    declared = schema.get("type")
    kinds = [declared] if isinstance(declared, str) else declared
    types = {t for t in kinds if isinstance(t, str)} if isinstance(kinds, list) else set()
    for combinator in ("anyOf", "oneOf"):
        options = schema.get(combinator)
        for option in options if isinstance(options, list) and depth < MAX_DEPTH else ():
            if isinstance(option, Mapping):
                types |= _types(option, depth + 1)
    return types
