"""Server-sent events: Responses stream events as typed SSE frames.

Each frame is `event: <type>` plus `data: <json>` whose `type` matches, numbered by
`sequence_number` from 0 in the order sent. Keep-alives are SSE comments, which the
`openai` SDK skips.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any

from mlxcel.actors.messages import (
    CompactionCompleted,
    CompactionStarted,
    ContentPartAdded,
    ContentPartDone,
    FunctionCallArgumentsDelta,
    FunctionCallArgumentsDone,
    KeepAlive,
    OutputItemAdded,
    OutputItemDone,
    OutputTextDelta,
    OutputTextDone,
    ReasoningTextDelta,
    ReasoningTextDone,
    ResponseCreated,
    ResponseEvent,
    ResponseFinished,
    ResponseInProgress,
    StreamError,
)
from mlxcel.http.objects import item_json, logprob_json, part_json, response_json

KEEPALIVE_FRAME = b": keep-alive\n\n"

_FINISHED = {
    "completed": "response.completed",
    "incomplete": "response.incomplete",
    "failed": "response.failed",
    "cancelled": "response.failed",
}


def event_json(event: ResponseEvent) -> dict[str, Any]:
    """The event's JSON without its sequence number.

    Every event names its response (`response_id`), but the OpenAI events have no such
    field: only the `mlx.compaction.*` events, which always carried it, send it."""
    match event:
        case ResponseCreated(record):
            return {"type": "response.created", "response": response_json(record)}
        case ResponseInProgress(record):
            return {"type": "response.in_progress", "response": response_json(record)}
        case CompactionStarted():
            return {"type": "mlx.compaction.started", **dataclasses.asdict(event)}
        case CompactionCompleted():
            return {"type": "mlx.compaction.completed", **dataclasses.asdict(event)}
        case OutputItemAdded() | OutputItemDone():
            kind = "added" if isinstance(event, OutputItemAdded) else "done"
            return {
                "type": f"response.output_item.{kind}",
                "output_index": event.output_index,
                "item": item_json(event.item),
            }
        case ContentPartAdded() | ContentPartDone():
            kind = "added" if isinstance(event, ContentPartAdded) else "done"
            return {
                "type": f"response.content_part.{kind}",
                **_in_part(event),
                "part": part_json(event.part),
            }
        case ReasoningTextDelta():
            return {
                "type": "response.reasoning_text.delta",
                **_in_part(event),
                "delta": event.delta,
            }
        case ReasoningTextDone():
            return {"type": "response.reasoning_text.done", **_in_part(event), "text": event.text}
        case OutputTextDelta():
            return {
                "type": "response.output_text.delta",
                **_in_part(event),
                "delta": event.delta,
                "logprobs": [logprob_json(e) for e in event.logprobs],
            }
        case OutputTextDone():
            return {
                "type": "response.output_text.done",
                **_in_part(event),
                "text": event.text,
                "logprobs": [],
            }
        case FunctionCallArgumentsDelta():
            return {
                "type": "response.function_call_arguments.delta",
                **_in_item(event),
                "delta": event.delta,
            }
        case FunctionCallArgumentsDone():
            return {
                "type": "response.function_call_arguments.done",
                **_in_item(event),
                "arguments": event.arguments,
            }
        case ResponseFinished(record):
            return {"type": _FINISHED[record.status], "response": response_json(record)}
        case StreamError(code=code, message=message):
            return {"type": "error", "code": code, "message": message, "param": None}
    raise AssertionError(event)


def _in_item(event: FunctionCallArgumentsDelta | FunctionCallArgumentsDone) -> dict[str, Any]:
    """Where an event inside an item points: the item and its output index."""
    return {"item_id": event.item_id, "output_index": event.output_index}


def _in_part(
    event: ContentPartAdded
    | ContentPartDone
    | OutputTextDelta
    | OutputTextDone
    | ReasoningTextDelta
    | ReasoningTextDone,
) -> dict[str, Any]:
    """Where an event inside a content part points: the item, its index, the part's index."""
    return {
        "item_id": event.item_id,
        "output_index": event.output_index,
        "content_index": event.content_index,
    }


class SseEncoder:
    """Numbers and encodes one stream's events."""

    def __init__(self) -> None:
        self._sequence = 0

    def encode(self, event: ResponseEvent) -> bytes:
        if isinstance(event, KeepAlive):
            return KEEPALIVE_FRAME
        body = event_json(event)
        body["sequence_number"] = self._sequence
        self._sequence += 1
        data = json.dumps(body, ensure_ascii=False, separators=(",", ":"), allow_nan=False)
        return f"event: {body['type']}\ndata: {data}\n\n".encode()
