"""Conversation items → the message dicts chat templates read.

Model-independent: Responses items become system/user/assistant/tool messages, with
`tool_calls` on the assistant turn that made them and a reasoning trace as
`reasoning_content` where templates keep it. The model's codec (`model/prompt.py`)
renders them into tokens.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from mlxcel.errors import InvalidRequest
from mlxcel.items import FunctionCall, FunctionCallOutput, Item, Message, Reasoning, replay

ChatMessage = dict[str, Any]
"""One message as chat templates read it (the codec's `ChatMessage`)."""


def to_chat(instructions: str | None, items: Sequence[Item]) -> list[ChatMessage]:
    """The chat messages for `instructions` followed by `items` (a compaction standing
    in for the items before it)."""
    messages: list[ChatMessage] = []
    pending_reasoning = ""
    if instructions:
        messages.append({"role": "system", "content": instructions})
    for item in replay(items):
        match item:
            case Message(role=role):
                chat_role = "system" if role == "developer" else role
                messages.append({"role": chat_role, "content": item.text})
                if role == "assistant" and pending_reasoning:
                    messages[-1]["reasoning_content"] = pending_reasoning
                pending_reasoning = ""
            case FunctionCall(call_id=call_id, arguments=arguments):
                # A custom tool's input goes back as the one argument the model wrote it as.
                parsed = {"input": arguments} if item.custom else _arguments(arguments)
                call = {
                    "id": call_id,
                    "type": "function",
                    "function": {"name": item.flat_name, "arguments": parsed},
                }
                last = messages[-1] if messages else None
                if last is not None and last["role"] == "assistant":
                    last.setdefault("tool_calls", []).append(call)
                else:
                    messages.append({"role": "assistant", "content": "", "tool_calls": [call]})
                    if pending_reasoning:  # the trace that led to the call, as templates keep it
                        messages[-1]["reasoning_content"] = pending_reasoning
                    pending_reasoning = ""
            case FunctionCallOutput(call_id=call_id, output=output):
                messages.append({"role": "tool", "tool_call_id": call_id, "content": output})
            case Reasoning(text=text):
                pending_reasoning = text  # templates that keep traces read it from the turn
    if not any(m["role"] in ("user", "tool") for m in messages):
        raise InvalidRequest("The input must contain at least one user message.", param="input")
    return messages


def _arguments(arguments: str) -> Any:
    """Templates expect parsed arguments (they `tojson` them); keep text that isn't JSON."""
    try:
        return json.loads(arguments)
    except ValueError:
        return arguments
