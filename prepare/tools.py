"""Function tools at the edge: validation, `tool_choice`, and the grammar of a forced call.

Only `function` and `custom` tools run here, and `namespace` tools (groups of functions, as
Codex CLI sends) are flattened into them; hosted tool types were screened out before
(`prepare/policy.py`), and one met here anyway answers 400. With `tool_choice`
"required" or a named function, the reply is constrained to one call to an allowed tool
(`{"name": …, "arguments": …}`, inside `<tool_call>` tokens for models that write the Hermes
form), so the model cannot answer without it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

from mlxcel.errors import InvalidRequest, UnsupportedFeature
from mlxcel.generation import CustomGrammar, PromptCodec, ToolUse
from mlxcel.items import JsonValue, flat_name
from mlxcel.prepare.custom_tools import custom_definition, custom_grammars, custom_names
from mlxcel.prepare.policy import HOSTED_TOOLS_HINT


def function_tools(
    tools: Sequence[dict[str, JsonValue]] | None, skip: frozenset[int] = frozenset()
) -> tuple[list[dict[str, Any]], dict[str, tuple[str, str]]]:
    """Chat-template definitions of the request's functions (400 for hosted tools), but
    for the tools at the places in `skip`.

    `namespace` tools are flattened into their functions under `flat_name`s; the second
    result maps those names back to (namespace, name)."""
    out: list[dict[str, Any]] = []
    namespaces: dict[str, tuple[str, str]] = {}
    for index, tool in enumerate(tools or []):
        if index in skip:
            continue
        if tool.get("type") != "namespace":
            out.append(_definition(tool, f"tools[{index}]"))
            continue
        namespace = tool.get("name")
        members = tool.get("tools")
        if not isinstance(namespace, str) or not namespace:
            raise InvalidRequest(
                "Missing required parameter: 'name'.",
                param=f"tools[{index}].name",
                code="missing_required_parameter",
            )
        if not isinstance(members, list):
            raise InvalidRequest(
                "A namespace tool needs a 'tools' list.",
                param=f"tools[{index}].tools",
                code="missing_required_parameter",
            )
        for inner, member in enumerate(members):
            if not isinstance(member, dict):
                raise InvalidRequest(
                    "Each tool must be an object.",
                    param=f"tools[{index}].tools[{inner}]",
                    code="invalid_type",
                )
            definition = _definition(member, f"tools[{index}].tools[{inner}]")
            name = definition["function"]["name"]
            definition["function"]["name"] = flat = flat_name(namespace, name)
            namespaces[flat] = (namespace, name)
            out.append(definition)
    return out, namespaces


def _definition(tool: dict[str, JsonValue], where: str) -> dict[str, Any]:
    kind = tool.get("type")
    if kind == "custom":
        return custom_definition(tool, where)
    if kind != "function":
        raise UnsupportedFeature(
            f"Tool type {kind!r} is not supported: {HOSTED_TOOLS_HINT}.",
            param=f"{where}.type",
            code="unsupported_tool",
        )
    if not isinstance(tool.get("name"), str) or not tool["name"]:
        raise InvalidRequest(
            "Missing required parameter: 'name'.",
            param=f"{where}.name",
            code="missing_required_parameter",
        )
    if tool.get("strict") is not None and not isinstance(tool["strict"], bool):
        raise InvalidRequest(
            "Invalid 'strict': expected a boolean.", param=f"{where}.strict", code="invalid_type"
        )
    function = {
        "name": tool["name"],
        "description": tool.get("description") or "",
        "parameters": tool.get("parameters") or {"type": "object", "properties": {}},
    }
    return {"type": "function", "function": function}


def _check_unique(definitions: Sequence[dict[str, Any]]) -> None:
    """400 for two tools the model would see under one name (a call could not be told
    apart)."""
    seen: set[str] = set()
    for definition in definitions:
        name = definition["function"]["name"]
        if name in seen:
            raise InvalidRequest(
                f"Invalid 'tools': more than one tool is named {name[:64]!r}.",
                param="tools",
                code="invalid_value",
            )
        seen.add(name)


def chosen_tool(choice: str | dict[str, JsonValue] | None) -> tuple[str, str | None]:
    """`tool_choice` as (mode, function name): mode is auto, none or required."""
    if choice is None or choice in ("auto", "none", "required"):
        return (choice or "auto"), None
    if isinstance(choice, dict) and choice.get("type") in ("function", "custom"):
        nested = choice.get("function")
        name = nested.get("name") if isinstance(nested, dict) else choice.get("name")
        if isinstance(name, str) and name:
            return "required", name
    raise InvalidRequest(
        "Invalid 'tool_choice': expected 'auto', 'none', 'required', "
        '{"type": "function", "name": ...} or {"type": "custom", "name": ...}.',
        param="tool_choice",
        code="invalid_value",
    )


def _check_kind(choice: object, name: str, custom: frozenset[str]) -> None:
    """A named `tool_choice` names the tool as the kind it is (`custom` or `function`)."""
    kind = choice.get("type") if isinstance(choice, dict) else None
    actual = "custom" if name in custom else "function"
    if kind != actual:
        raise InvalidRequest(
            f"'tool_choice' names {name[:64]!r} as a {kind} tool, but it is a {actual} tool.",
            param="tool_choice.type",
            code="invalid_value",
        )


def tool_use(
    tools: Sequence[dict[str, JsonValue]] | None,
    choice: str | dict[str, JsonValue] | None,
    codec: PromptCodec,
    *,
    parser: str = "hermes",
    parallel: bool | None = None,
    skip: frozenset[int] = frozenset(),
    grammar: bool = True,
) -> tuple[list[dict[str, Any]], ToolUse | None, str | None]:
    """The tools to render (but those at the places in `skip`), how the reply may call
    them, and (unless `grammar` is off) the reply's grammar: a forced call's, or the one
    enforcing custom tools' grammars on their calls."""
    definitions, namespaces = function_tools(tools, skip)
    _check_unique(definitions)
    mode, name = chosen_tool(choice)
    if mode == "none" or not definitions:
        if mode == "required":
            raise InvalidRequest(
                "'tool_choice' requires a call, but no tools were given.",
                param="tool_choice",
                code="invalid_value",
            )
        return ([] if mode == "none" else definitions), None, None
    parameters = {d["function"]["name"]: d["function"]["parameters"] for d in definitions}
    inner = [flat for flat, (_, function) in namespaces.items() if function == name]
    if name not in parameters and len(inner) == 1:
        name = inner[0]  # a namespaced function named without its namespace
    if name is not None and name not in parameters:
        raise InvalidRequest(
            f"'tool_choice' names {name!r}, which is not among the tools.",
            param="tool_choice",
            code="invalid_value",
        )
    custom = custom_names(tools)
    if name is not None:
        _check_kind(choice, name, custom)
    use = ToolUse(
        frozenset([name] if name is not None else parameters),
        required=mode == "required",
        parser=parser,
        parallel=parallel is not False,
        parameters=parameters,
        namespaces=namespaces,
        custom=custom,
    )
    if not grammar:
        return definitions, use, None
    enforced = [c for c in custom_grammars(tools, skip) if c.name in use.names]
    if enforced:
        held = _custom_grammar(use, enforced, codec)
        if held is not None:
            use = dataclasses.replace(use, held=frozenset(c.name for c in enforced))
        return definitions, use, held
    return definitions, use, _call_grammar(use, codec) if use.required else None


def _custom_grammar(use: ToolUse, custom: list[CustomGrammar], codec: PromptCodec) -> str | None:
    """The grammar enforcing the custom tools' grammars on their calls; calls to the
    other allowed tools are free, or valid against their parameters when the reply
    must call."""
    constrained = {c.name for c in custom}
    others = [name for name in use.parameters if name in use.names - constrained]
    schema = _calls_schema(use, others) if use.required and others else None
    return codec.compile_custom_tools(
        custom, others, use.parser, call_schema=schema, required=use.required
    )


def _call_grammar(use: ToolUse, codec: PromptCodec) -> str:
    """The grammar of the one call a reply must make: an allowed tool's name, and
    arguments valid against its parameters (a 400 for parameters no grammar can hold)."""
    schema = _calls_schema(use, [tool for tool in use.parameters if tool in use.names])
    try:
        return codec.compile_call(schema, use.parser)
    except InvalidRequest as exc:
        raise InvalidRequest(
            f"Invalid tool parameters: {exc.message}", param="tools", code="invalid_tool_parameters"
        ) from exc


def _calls_schema(use: ToolUse, names: list[str]) -> dict[str, Any]:
    """The JSON schema of one call (`name`, `arguments`) to one of `names`."""
    calls = [
        {
            "type": "object",
            "properties": {"name": {"const": tool}, "arguments": use.parameters[tool]},
            "required": ["name", "arguments"],
            "additionalProperties": False,
        }
        for tool in names
    ]
    return calls[0] if len(calls) == 1 else {"anyOf": calls}
