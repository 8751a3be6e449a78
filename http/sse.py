"""Server-sent events: Responses stream events as typed SSE frames.

Each frame is `event: <type>` plus `data: <json>` whose `type` matches, numbered by
`sequence_number` from 0 in the order sent. Keep-alives are `mlx.progress` events
(numbered like the others) or, with progress events off, SSE comments, which the
`openai` SDK skips.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any

from mlxcel.http.objects import item_json, logprob_json, part_json, response_json
from mlxcel.items import ResponseRecord
from mlxcel.respond.events import (
    CompactionCompleted,
    CompactionStarted,
    ContentPartAdded,
    ContentPartDone,
    CustomToolCallInputDelta,
    CustomToolCallInputDone,
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
    ResponseQueued,
    StreamError,
)

KEEPALIVE_FRAME = b": keep-alive\n\n"

_FINISHED = {
    "completed": "response.completed",
    "incomplete": "response.incomplete",
    "failed": "response.failed",
    "cancelled": "response.failed",
}


def event_json(event: ResponseEvent, *, encrypted: bool = False) -> dict[str, Any]:
    """The event's JSON without its sequence number; `encrypted`: a finished reasoning
    item carries `encrypted_content` (`include: ["reasoning.encrypted_content"]`)."""
    match event:
        case ResponseCreated(record):
            return {"type": "response.created", "response": response_json(record)}
        case ResponseInProgress(record):
            return {"type": "response.in_progress", "response": response_json(record)}
        case CompactionStarted():  # the `mlx.` events name their response
            return {"type": "mlx.compaction.started", **dataclasses.asdict(event)}
        case CompactionCompleted():
            return {"type": "mlx.compaction.completed", **dataclasses.asdict(event)}
        case OutputItemAdded() | OutputItemDone():
            kind = "added" if isinstance(event, OutputItemAdded) else "done"
            return {
                "type": f"response.output_item.{kind}",
                "output_index": event.output_index,
                "item": item_json(event.item, encrypted=encrypted and kind == "done"),
            }
        case ContentPartAdded() | ContentPartDone():
            kind = "added" if isinstance(event, ContentPartAdded) else "done"
            return {
                "type": f"response.content_part.{kind}",
                "item_id": event.item_id,
                "output_index": event.output_index,
                "content_index": event.content_index,
                "part": part_json(event.part),
            }
        case ReasoningTextDelta() | ReasoningTextDone():
            kind = "delta" if isinstance(event, ReasoningTextDelta) else "done"
            return {"type": f"response.reasoning_text.{kind}", **_fields(event)}
        case OutputTextDelta():  # the most frequent event: no `asdict`
            return {
                "type": "response.output_text.delta",
                "item_id": event.item_id,
                "output_index": event.output_index,
                "content_index": event.content_index,
                "delta": event.delta,
                "logprobs": [logprob_json(e) for e in event.logprobs],
            }
        case OutputTextDone():
            return {"type": "response.output_text.done", **_fields(event), "logprobs": []}
        case FunctionCallArgumentsDelta() | FunctionCallArgumentsDone():
            kind = "delta" if isinstance(event, FunctionCallArgumentsDelta) else "done"
            return {"type": f"response.function_call_arguments.{kind}", **_fields(event)}
        case CustomToolCallInputDelta() | CustomToolCallInputDone():
            kind = "delta" if isinstance(event, CustomToolCallInputDelta) else "done"
            return {"type": f"response.custom_tool_call_input.{kind}", **_fields(event)}
        case ResponseFinished(record):
            return {"type": _FINISHED[record.status], "response": response_json(record)}
        case KeepAlive():
            return {"type": "mlx.progress", **dataclasses.asdict(event)}
        case StreamError(code=code, message=message):
            return {"type": "error", "code": code, "message": message, "param": None}
    raise AssertionError(event)


def _fields(
    event: OutputTextDone
    | ReasoningTextDelta
    | ReasoningTextDone
    | FunctionCallArgumentsDelta
    | FunctionCallArgumentsDone
    | CustomToolCallInputDelta
    | CustomToolCallInputDone,
) -> dict[str, Any]:
    """The event's own fields, in order, less `response_id`: every event names its
    response inside the server, but the OpenAI events have no such field."""
    fields = dataclasses.asdict(event)
    del fields["response_id"]
    return fields


class SseEncoder:
    """Numbers and encodes one stream's events."""

    def __init__(self, *, progress: bool = True) -> None:
        self._sequence = 0
        self._progress = progress
        self._encrypted = False  # the stream's first event tells

    def encode(self, event: ResponseEvent) -> bytes:
        if isinstance(event, KeepAlive) and not self._progress:
            return KEEPALIVE_FRAME
        if isinstance(event, ResponseCreated):
            self._encrypted = "reasoning.encrypted_content" in event.record.echo.include
        body = event_json(event, encrypted=self._encrypted)
        body["sequence_number"] = self._sequence
        self._sequence += 1
        return self.frame(body)

    def frame(self, body: dict[str, Any]) -> bytes:
        return sse_frame(body)


class SocketEncoder(SseEncoder):
    """Numbers and encodes one response's events as WebSocket messages: each the JSON
    its SSE frame's `data:` carries. Without progress events a keep-alive is nothing
    (`b""`, not sent): the socket's own pings keep it open. The response's final record
    is kept (`finished`), so the connection can remember a `store: false` one."""

    def __init__(self, *, progress: bool = True) -> None:
        super().__init__(progress=progress)
        self.finished: ResponseRecord | None = None

    def encode(self, event: ResponseEvent) -> bytes:
        if isinstance(event, ResponseFinished):
            self.finished = event.record
        if isinstance(event, KeepAlive) and not self._progress:
            return b""
        return super().encode(event)

    def frame(self, body: dict[str, Any]) -> bytes:
        return json.dumps(body, ensure_ascii=False, separators=(",", ":"), allow_nan=False).encode()


def numbered_frame(event: ResponseEvent | ResponseQueued, sequence_number: int) -> bytes:
    """The frame of `event` numbered `sequence_number`, as `SseEncoder` writes it: what a
    background response's event log keeps (never a keep-alive)."""
    body: dict[str, Any]
    if isinstance(event, ResponseQueued):
        body = {"type": "response.queued", "response": response_json(event.record)}
    else:
        body = event_json(event)
    body["sequence_number"] = sequence_number
    return sse_frame(body)


def sse_frame(body: dict[str, Any]) -> bytes:
    """One event's frame; `body` holds its `type` and `sequence_number`."""
    data = json.dumps(body, ensure_ascii=False, separators=(",", ":"), allow_nan=False)
    return f"event: {body['type']}\ndata: {data}\n\n".encode()
