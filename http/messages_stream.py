"""A response's stream events as Anthropic's: `message_start` once the prompt is read
(its usage then known: how much the prompt cache served), then per content block
`content_block_start`, its deltas and `content_block_stop`, then `message_delta` (the
stop reason and usage) and `message_stop`; `ping` while nothing else is sent.

Each frame is `event: <type>` with a `data:` object of the same `type`. Blocks are
numbered from 0 in the order they start, each stopped before the next starts (the
builder closes an item before it opens the next); a text block starts with its first
text that is not whitespace, so whitespace alone makes no block (nor does it in the
message object). A thinking block's signature is sent as its last delta, once its trace
is whole; a `tool_use` block's input streams as the tool-call parser releases the
arguments (`input_json_delta`). A failure after the 200 is an `error` event, and the
stream ends there.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from mlxcel.http.errors import anthropic_type
from mlxcel.http.messages_objects import (
    Thinking,
    started_message,
    stop_reason,
    usage_json,
)
from mlxcel.http.streaming import Framing
from mlxcel.items import FunctionCall, Message, Reasoning, ResponseRecord, Usage
from mlxcel.respond.events import (
    FunctionCallArgumentsDelta,
    OutputItemAdded,
    OutputItemDone,
    OutputTextDelta,
    PromptRead,
    ReasoningTextDelta,
    ResponseEvent,
    ResponseFinished,
    StreamError,
)


def named_frame(chunk: dict[str, Any]) -> bytes:
    data = json.dumps(chunk, ensure_ascii=False, separators=(",", ":"), allow_nan=False)
    return f"event: {chunk['type']}\ndata: {data}\n\n".encode()


PING = named_frame({"type": "ping"})
MESSAGE_FRAMES = Framing(named_frame, PING, None)
"""Anthropic's stream: named events, `ping` to keep it alive, nothing after the last."""


def error_event(error_type: str, message: str) -> dict[str, Any]:
    return {"type": "error", "error": {"type": error_type, "message": message}}


@dataclass
class MessageEvents:
    """One response's events as Anthropic's stream events."""

    record: ResponseRecord
    thinking: Thinking
    marked: bool = False
    """The request set `cache_control` (`usage_json`)."""
    _blocks: dict[str, int] = field(default_factory=dict)
    """The open block of each output item (by item id), as its index."""
    _unsent: dict[str, list[str]] = field(default_factory=dict)
    """Text of messages whose block waits for text that is not whitespace."""
    _started: int = 0
    _opened: bool = False
    """`message_start` was sent."""

    def _open(self, usage: Usage) -> list[dict[str, Any]]:
        """`message_start`, once: sent when the prompt is read, so its usage is the one
        `message_delta` and the message object repeat (the output tokens aside)."""
        if self._opened:
            return []
        self._opened = True
        shown = usage_json(usage, marked=self.marked) | {"output_tokens": 0}
        return [{"type": "message_start", "message": started_message(self.record, shown)}]

    def translate(self, event: ResponseEvent) -> list[dict[str, Any]]:
        match event:
            case PromptRead(prompt_tokens=prompt, cached_tokens=cached, cache_write_tokens=kept):
                return self._open(Usage(prompt, cached_tokens=cached, cache_write_tokens=kept))
            case OutputItemAdded(item=Message(id=str(item_id))):
                self._unsent[item_id] = []
            case OutputItemAdded(item=Reasoning(id=str(item_id))):
                thinking = {"type": "thinking", "thinking": "", "signature": ""}
                return [self._start(item_id, thinking)]
            case OutputItemAdded(item=FunctionCall(id=str(item_id), call_id=call_id, name=name)):
                use = {"type": "tool_use", "id": call_id, "name": name, "input": {}}
                return [self._start(item_id, use)]
            case ReasoningTextDelta(item_id=item_id, delta=delta) if self.thinking.shown:
                return [self._delta(item_id, {"type": "thinking_delta", "thinking": delta})]
            case OutputTextDelta(item_id=item_id, delta=delta):
                return self._text(item_id, delta)
            case FunctionCallArgumentsDelta(item_id=item_id, delta=delta) if delta:
                return [self._delta(item_id, {"type": "input_json_delta", "partial_json": delta})]
            case OutputItemDone(item=Reasoning(text=text, id=item_id)) if item_id in self._blocks:
                signature = {"type": "signature_delta", "signature": self.thinking.sign(text)}
                return [self._delta(item_id, signature), self._stop(item_id)]
            case OutputItemDone(item=Message(id=item_id) | FunctionCall(id=item_id)) if (
                item_id in self._blocks
            ):
                return [self._stop(item_id)]
            case OutputItemDone(item=Message(id=str(item_id))):
                self._unsent.pop(item_id, None)  # whitespace alone: no block
            case StreamError(message=message):
                return [error_event(anthropic_type(500), message)]
            case ResponseFinished(record=record) if record.status in ("completed", "incomplete"):
                opened = self._open(record.usage or Usage())
                return [*opened, self._delta_of_message(record), {"type": "message_stop"}]
        return []

    def _text(self, item_id: str, delta: str) -> list[dict[str, Any]]:
        """A text block starts with its first text that is not whitespace (as in the
        message object, which has no block of whitespace alone)."""
        unsent = self._unsent.get(item_id)
        if unsent is None:
            return [self._delta(item_id, {"type": "text_delta", "text": delta})]
        unsent.append(delta)
        text = "".join(unsent)
        if not text.strip():
            return []
        del self._unsent[item_id]
        start = self._start(item_id, {"type": "text", "text": ""})
        return [start, self._delta(item_id, {"type": "text_delta", "text": text})]

    def _start(self, item_id: str, block: dict[str, Any]) -> dict[str, Any]:
        index = self._blocks[item_id] = self._started
        self._started += 1
        return {"type": "content_block_start", "index": index, "content_block": block}

    def _delta(self, item_id: str, delta: dict[str, Any]) -> dict[str, Any]:
        return {"type": "content_block_delta", "index": self._blocks[item_id], "delta": delta}

    def _stop(self, item_id: str) -> dict[str, Any]:
        return {"type": "content_block_stop", "index": self._blocks.pop(item_id)}

    def _delta_of_message(self, record: ResponseRecord) -> dict[str, Any]:
        delta = {"stop_reason": stop_reason(record), "stop_sequence": record.stop_sequence}
        usage = usage_json(record.usage, marked=self.marked)
        return {"type": "message_delta", "delta": delta, "usage": usage}
