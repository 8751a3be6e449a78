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

import json
import re
from collections.abc import Mapping
from typing import Any

from mlxcel.model.tool_parsers.events import ParseEvent
from mlxcel.model.tool_parsers.hermes import HermesToolParser, TaggedCall

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
            members.append(
                f"{json.dumps(key, ensure_ascii=False)}: "
                + json.dumps(self._value(name, key, value), ensure_ascii=False)
            )
            pos = bounds[1]
        end = _FUNCTION_END.match(body, pos)
        closed = end is not None or lenient
        complete = closed and not body[end.end() if end else pos :].strip()
        return name, _object(members, closed=closed), complete

    def _value(self, tool: str, key: str, text: str) -> Any:
        text = text.removeprefix("\n").removesuffix("\n")
        types = _types(_property(self.parameters.get(tool), key))
        if text.strip() == "null" and "null" in types:
            return None
        if not types or "string" in types:
            return text
        try:
            return json.loads(text, parse_constant=_reject)
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


def _property(schema: Mapping[str, Any] | None, key: str) -> Mapping[str, Any]:
    properties = (schema or {}).get("properties")
    found = properties.get(key) if isinstance(properties, Mapping) else None
    return found if isinstance(found, Mapping) else {}


def _types(schema: Mapping[str, Any]) -> set[str]:
    """The JSON types a schema allows, from `type` and any `anyOf`/`oneOf` options."""
    declared = schema.get("type")
    kinds = [declared] if isinstance(declared, str) else declared
    types = {t for t in kinds if isinstance(t, str)} if isinstance(kinds, list) else set()
    for combinator in ("anyOf", "oneOf"):
        options = schema.get(combinator)
        for option in options if isinstance(options, list) else ():
            if isinstance(option, Mapping):
                types |= _types(option)
    return types


def _reject(constant: str) -> Any:
    """JSON has no NaN or infinities, though Python's reader takes them."""
    raise ValueError(constant)
