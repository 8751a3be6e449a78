"""From a validated create body to a `GenerationRequest`: checks, echo, rendering.

Everything that can reject a request before generation happens here, so a bad request
is a 400 before any slot is taken.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from mlxcel.actors.messages import GenerationRequest
from mlxcel.errors import ContextLengthExceeded, InvalidRequest, ModelNotFound, UnsupportedFeature
from mlxcel.http.schemas import CreateResponseBody, to_items
from mlxcel.items import JsonValue, RequestEcho, ResponseRecord, new_id
from mlxcel.model.engine import ModelInfo, PromptCodec, Sampling
from mlxcel.model.prompt import to_chat

HOSTED_TOOL_HINT = "this server runs no hosted tools; only `function` tools are supported"


@dataclass(frozen=True, slots=True)
class ModelNames:
    """The names a request's `model` may use for the loaded model."""

    alias: str
    path: str

    def matches(self, name: str) -> bool:
        wanted = name.strip().rstrip("/").lower()
        candidates = {self.alias.lower(), self.path.rstrip("/").lower()}
        candidates.add(self.path.rstrip("/").rsplit("/", 1)[-1].lower())
        return wanted in candidates


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
            raise InvalidRequest("Missing required parameter: 'name'.",
                                 param=f"tools[{index}].name", code="missing_required_parameter")
        function = {"name": tool["name"], "description": tool.get("description") or "",
                    "parameters": tool.get("parameters") or {"type": "object", "properties": {}}}
        out.append({"type": "function", "function": function})
    return out


def build_request(
    body: CreateResponseBody, names: ModelNames, info: ModelInfo, codec: PromptCodec
) -> GenerationRequest:
    if not names.matches(body.model):
        raise ModelNotFound(body.model, [names.alias])
    if body.truncation == "auto":
        raise UnsupportedFeature("Only `truncation: \"disabled\"` is supported.",
                                 param="truncation", code="unsupported_value")
    if body.background:
        raise UnsupportedFeature("Background mode is not available yet.", param="background",
                                 code="unsupported_value")
    if body.previous_response_id is not None:
        raise UnsupportedFeature("`previous_response_id` is not available yet.",
                                 param="previous_response_id", code="unsupported_value")
    if body.conversation is not None:
        raise UnsupportedFeature("`conversation` is not available yet.", param="conversation",
                                 code="unsupported_value")
    tools = function_tools(body.tools)
    items = to_items(body)
    prompt = codec.render(to_chat(body.instructions, items), tools or None)
    room = info.context_length - len(prompt)
    if room < 1:
        raise ContextLengthExceeded(
            f"The input is {len(prompt)} tokens; the context window is "
            f"{info.context_length} tokens and leaves no room for output."
        )
    max_tokens = min(body.max_output_tokens or room, room)
    echo = RequestEcho(
        model=body.model,
        instructions=body.instructions,
        max_output_tokens=body.max_output_tokens,
        temperature=1.0 if body.temperature is None else body.temperature,
        top_p=1.0 if body.top_p is None else body.top_p,
        top_logprobs=body.top_logprobs or 0,
        store=True if body.store is None else body.store,
        metadata=dict(body.metadata or {}),
        tool_choice=body.tool_choice if body.tool_choice is not None else "auto",
        tools=tuple(body.tools or ()),
        parallel_tool_calls=True if body.parallel_tool_calls is None else body.parallel_tool_calls,
        text=body.text if body.text is not None else {"format": {"type": "text"}},
        reasoning=body.reasoning,
        user=body.user,
    )
    record = ResponseRecord(
        id=new_id("resp"), created_at=int(time.time()), status="in_progress", echo=echo,
        input_items=items,
    )
    sampling = Sampling(temperature=echo.temperature, top_p=echo.top_p, max_tokens=max_tokens)
    return GenerationRequest(record=record, prompt=tuple(prompt), sampling=sampling)
