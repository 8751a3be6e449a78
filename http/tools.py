"""Function tools at the edge: validation, `tool_choice`, and the grammar of a forced call.

Only `function` tools run here; every hosted tool type answers 400. With `tool_choice`
"required" or a named function, the reply is constrained to one JSON call
(`{"name": …, "arguments": …}`) to an allowed tool, so the model cannot answer without it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from mlxcel.actors.messages import ToolUse
from mlxcel.errors import InvalidRequest, UnsupportedFeature
from mlxcel.items import JsonValue
from mlxcel.model.engine import PromptCodec

HOSTED_TOOL_HINT = "this server runs no hosted tools; only `function` tools are supported"


def function_tools(tools: Sequence[dict[str, JsonValue]] | None) -> list[dict[str, Any]]:
    """Chat-template tool definitions for the request's function tools (400 for others)."""
    out: list[dict[str, Any]] = []
    for index, tool in enumerate(tools or []):
        kind = tool.get("type")
        if kind != "function":
            raise UnsupportedFeature(
                f"Tool type {kind!r} is not supported: {HOSTED_TOOL_HINT}.",
                param=f"tools[{index}].type",
                code="unsupported_tool",
            )
        if not isinstance(tool.get("name"), str) or not tool["name"]:
            raise InvalidRequest(
                "Missing required parameter: 'name'.",
                param=f"tools[{index}].name",
                code="missing_required_parameter",
            )
        function = {
            "name": tool["name"],
            "description": tool.get("description") or "",
            "parameters": tool.get("parameters") or {"type": "object", "properties": {}},
        }
        out.append({"type": "function", "function": function})
    return out


def chosen_tool(choice: str | dict[str, JsonValue] | None) -> tuple[str, str | None]:
    """`tool_choice` as (mode, function name): mode is auto, none or required."""
    if choice is None or choice in ("auto", "none", "required"):
        return (choice or "auto"), None
    if isinstance(choice, dict) and choice.get("type") == "function":
        nested = choice.get("function")
        name = nested.get("name") if isinstance(nested, dict) else choice.get("name")
        if isinstance(name, str) and name:
            return "required", name
    raise InvalidRequest(
        "Invalid 'tool_choice': expected 'auto', 'none', 'required' or "
        '{"type": "function", "name": ...}.',
        param="tool_choice",
        code="invalid_value",
    )


def tool_use(
    tools: Sequence[dict[str, JsonValue]] | None,
    choice: str | dict[str, JsonValue] | None,
    codec: PromptCodec,
) -> tuple[list[dict[str, Any]], ToolUse | None, str | None]:
    """The tools to render, how the reply may call them, and a forced call's grammar."""
    definitions = function_tools(tools)
    mode, name = chosen_tool(choice)
    if mode == "none" or not definitions:
        if mode == "required":
            raise InvalidRequest(
                "'tool_choice' requires a call, but no tools were given.",
                param="tool_choice",
                code="invalid_value",
            )
        return ([] if mode == "none" else definitions), None, None
    names = [d["function"]["name"] for d in definitions]
    if name is not None and name not in names:
        raise InvalidRequest(
            f"'tool_choice' names {name!r}, which is not among the tools.",
            param="tool_choice",
            code="invalid_value",
        )
    allowed = [name] if name is not None else names
    if mode != "required":
        return definitions, ToolUse(frozenset(names), required=False), None
    calls = [
        {
            "type": "object",
            "properties": {
                "name": {"const": d["function"]["name"]},
                "arguments": d["function"]["parameters"],
            },
            "required": ["name", "arguments"],
            "additionalProperties": False,
        }
        for d in definitions
        if d["function"]["name"] in allowed
    ]
    schema = calls[0] if len(calls) == 1 else {"anyOf": calls}
    try:
        grammar = codec.compile_schema(schema)
    except InvalidRequest as exc:
        raise InvalidRequest(
            f"Invalid tool parameters: {exc.message}", param="tools", code="invalid_tool_parameters"
        ) from exc
    return definitions, ToolUse(frozenset(allowed), required=True), grammar
