"""The JSON of Anthropic's Messages API, made from the response pipeline's records: the
`message` object, its content blocks and usage, and the `model` objects.

A response's output items map onto content blocks in order: reasoning is a `thinking`
block (with its signature), a message's text a `text` block, a function call a
`tool_use` block whose `input` is the parsed arguments. Usage splits the prompt as
Anthropic does: `cache_read_input_tokens` are those the prompt cache served, and
`input_tokens` the rest, read afresh. `cache_creation_input_tokens` is 0 unless the
request marks something with `cache_control` (Anthropic writes to its cache only then):
then it is the tokens read afresh that the prompt cache kept for the next request, and
`input_tokens` only those it did not keep. The three always add up to the prompt.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from mlxcel.items import FunctionCall, Item, Message, Reasoning, ResponseRecord, Usage

Sign = Callable[[str], str]
"""A trace's signature (`store/echo.py`: `trace_signature` under the request's prefix)."""


@dataclass(frozen=True, slots=True)
class Thinking:
    """How a response's traces are shown: signed, and their text sent or left out
    (`thinking.display: "omitted"`)."""

    sign: Sign
    shown: bool = True

    def block(self, trace: str) -> dict[str, Any]:
        text = trace if self.shown else ""
        return {"type": "thinking", "thinking": text, "signature": self.sign(trace)}


def message_id(record: ResponseRecord) -> str:
    return f"msg_{record.id.removeprefix('resp_')}"


def usage_json(usage: Usage | None, *, marked: bool = False) -> dict[str, int]:
    """`usage` as Anthropic's; `marked`: the request set `cache_control` somewhere, so
    the tokens the prompt cache kept are reported as written to it."""
    usage = usage or Usage()
    written = usage.cache_write_tokens if marked else 0
    fresh = max(0, usage.input_tokens - usage.cached_tokens - written)
    return {
        "input_tokens": fresh,
        "cache_creation_input_tokens": written,
        "cache_read_input_tokens": usage.cached_tokens,
        "output_tokens": usage.output_tokens,
    }


def stop_reason(record: ResponseRecord) -> str:
    if record.status == "incomplete" and record.incomplete_reason == "max_output_tokens":
        return "max_tokens"
    if any(isinstance(item, FunctionCall) for item in record.output):
        return "tool_use"
    if record.stop_sequence is not None:
        return "stop_sequence"
    return "end_turn"


def tool_input(arguments: str) -> dict[str, Any]:
    """A call's arguments as the object `input` is (an empty one when they are not)."""
    try:
        parsed = json.loads(arguments)
    except ValueError:
        return {}
    return parsed if isinstance(parsed, dict) else {}


def content_blocks(output: tuple[Item, ...], thinking: Thinking) -> list[dict[str, Any]]:
    blocks: list[dict[str, Any]] = []
    for item in output:
        match item:
            case Reasoning(text=text):
                blocks.append(thinking.block(text))
            case Message(text=text) if text.strip():  # no block of whitespace alone
                blocks.append({"type": "text", "text": text})
            case FunctionCall(call_id=call_id, name=name, arguments=arguments):
                block = {"type": "tool_use", "id": call_id, "name": name}
                blocks.append(block | {"input": tool_input(arguments)})
    return blocks


def message_json(
    record: ResponseRecord, thinking: Thinking, *, marked: bool = False
) -> dict[str, Any]:
    """The `message` object of a finished response (`marked`: see `usage_json`)."""
    return {
        "id": message_id(record),
        "type": "message",
        "role": "assistant",
        "model": record.echo.model,
        "content": content_blocks(record.output, thinking),
        "stop_reason": stop_reason(record),
        "stop_sequence": record.stop_sequence,
        "usage": usage_json(record.usage, marked=marked),
    }


def started_message(record: ResponseRecord, usage: dict[str, int]) -> dict[str, Any]:
    """The `message` of a stream's `message_start`: no content yet, and the prompt's
    `usage` as the finished message will show it."""
    return {
        "id": message_id(record),
        "type": "message",
        "role": "assistant",
        "model": record.echo.model,
        "content": [],
        "stop_reason": None,
        "stop_sequence": None,
        "usage": usage,
    }


def model_json(model_id: str, created: int, context_length: int | None) -> dict[str, Any]:
    """A `model` object as Anthropic's `/v1/models` answers it (its window once loaded)."""
    return {
        "type": "model",
        "id": model_id,
        "display_name": model_id,
        "created_at": rfc3339(created),
        "lifecycle": "active",
        "max_input_tokens": context_length,
    }


def model_list_json(models: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "data": models,
        "has_more": False,
        "first_id": models[0]["id"] if models else None,
        "last_id": models[-1]["id"] if models else None,
    }


def rfc3339(timestamp: int) -> str:
    return datetime.fromtimestamp(timestamp, UTC).isoformat().replace("+00:00", "Z")
