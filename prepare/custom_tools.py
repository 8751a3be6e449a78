"""`custom` tools (free-form input, as Codex CLI's `apply_patch`) offered as functions.

Chat templates know only functions, so a custom tool is shown to the model as a function
with one string argument, `input`; a grammar in its `format` is added to its description
for the model to read, and enforced while the model writes the call where its call markup
allows (`model/grammar/tool_grammars.py`). The model's call comes back as a `custom_tool_call`
whose `input` is that argument (`items.custom_input`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Literal

from mlxcel.errors import InvalidRequest
from mlxcel.generation import CustomGrammar
from mlxcel.items import JsonValue, flat_name

INPUT_PARAMETERS: dict[str, Any] = {
    "type": "object",
    "properties": {
        "input": {
            "type": "string",
            "description": "The tool's free-form input, as raw text (not JSON).",
        }
    },
    "required": ["input"],
    "additionalProperties": False,
}


def custom_definition(tool: dict[str, JsonValue], where: str) -> dict[str, Any]:
    """The chat-template function standing for a custom tool (400 for a malformed one)."""
    name = tool.get("name")
    if not isinstance(name, str) or not name:
        raise InvalidRequest(
            "Missing required parameter: 'name'.",
            param=f"{where}.name",
            code="missing_required_parameter",
        )
    description = tool.get("description")
    if description is not None and not isinstance(description, str):
        raise InvalidRequest(
            "Invalid 'description': expected a string.",
            param=f"{where}.description",
            code="invalid_type",
        )
    grammar = _grammar(tool.get("format"), f"{where}.format")
    text = description or ""
    if grammar is not None:
        syntax, definition = grammar
        hint = (
            f"Write the input as the string argument `input`; it must follow this "
            f"{syntax} grammar:\n{definition}"
        )
        text = f"{text}\n\n{hint}" if text else hint
    function = {"name": name, "description": text, "parameters": INPUT_PARAMETERS}
    return {"type": "function", "function": function}


def _grammar(value: JsonValue, where: str) -> tuple[str, str] | None:
    """A format's (syntax, definition); None for free text (`{"type": "text"}` or none)."""
    if value is None or (isinstance(value, dict) and value.get("type") == "text"):
        return None
    if isinstance(value, dict) and value.get("type") == "grammar":
        syntax, definition = value.get("syntax"), value.get("definition")
        if syntax in ("lark", "regex") and isinstance(definition, str):
            return str(syntax), definition
    raise InvalidRequest(
        'Invalid \'format\': expected {"type": "text"} or '
        '{"type": "grammar", "syntax": "lark" or "regex", "definition": ...}.',
        param=where,
        code="invalid_value",
    )


def custom_names(tools: Sequence[dict[str, JsonValue]] | None) -> frozenset[str]:
    """The flat names of the request's custom tools, namespaced ones included."""
    names: set[str] = set()
    for tool in tools or []:
        if tool.get("type") == "custom" and isinstance(tool.get("name"), str):
            names.add(str(tool["name"]))
        members = tool.get("tools") if tool.get("type") == "namespace" else None
        for member in members if isinstance(members, list) else []:
            if isinstance(member, dict) and member.get("type") == "custom":
                names.add(flat_name(str(tool.get("name")), str(member.get("name"))))
    return frozenset(names)


def custom_grammars(
    tools: Sequence[dict[str, JsonValue]] | None, skip: frozenset[int] = frozenset()
) -> list[CustomGrammar]:
    """The grammars of the request's custom tools (namespaced ones included), by the
    flat names the model calls them by; tools at the places in `skip` are left out."""
    found: list[CustomGrammar] = []
    for index, tool in enumerate(tools or []):
        if index in skip:
            continue
        members = tool.get("tools") if tool.get("type") == "namespace" else [tool]
        for inner, member in enumerate(members if isinstance(members, list) else []):
            if not isinstance(member, dict) or member.get("type") != "custom":
                continue
            where = f"tools[{index}]" if member is tool else f"tools[{index}].tools[{inner}]"
            grammar = _grammar(member.get("format"), f"{where}.format")
            if grammar is None:
                continue
            name = str(member.get("name"))
            if member is not tool:
                name = flat_name(str(tool.get("name")), name)
            syntax: Literal["lark", "regex"] = "lark" if grammar[0] == "lark" else "regex"
            found.append(CustomGrammar(name, syntax, grammar[1], f"{where}.format"))
    return found
