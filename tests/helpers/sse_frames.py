"""Response events of every kind, and reading SSE frames back the way clients read them:
split by the `openai` SDK's own SSE decoder, their data validated as the SDK's
`ResponseStreamEvent` union. Shared by the SSE encoder tests."""

from __future__ import annotations

import copy
import dataclasses
import json
from typing import Any

from openai._streaming import SSEDecoder
from openai.types.responses import (
    ResponseCompletedEvent,
    ResponseContentPartAddedEvent,
    ResponseContentPartDoneEvent,
    ResponseCreatedEvent,
    ResponseCustomToolCallInputDeltaEvent,
    ResponseCustomToolCallInputDoneEvent,
    ResponseErrorEvent,
    ResponseFailedEvent,
    ResponseFunctionCallArgumentsDeltaEvent,
    ResponseFunctionCallArgumentsDoneEvent,
    ResponseIncompleteEvent,
    ResponseInProgressEvent,
    ResponseOutputItemAddedEvent,
    ResponseOutputItemDoneEvent,
    ResponseReasoningTextDeltaEvent,
    ResponseReasoningTextDoneEvent,
    ResponseStreamEvent,
    ResponseTextDeltaEvent,
    ResponseTextDoneEvent,
)
from pydantic import BaseModel, TypeAdapter

from mlxcel.http.sse import SseEncoder
from mlxcel.items import (
    Compaction,
    FunctionCall,
    Message,
    OutputText,
    Reasoning,
    RequestEcho,
    ResponseError,
    ResponseRecord,
    TokenLogprob,
    Usage,
)
from mlxcel.respond.events import (
    CompactionCompleted,
    CompactionStarted,
    ContentPartAdded,
    ContentPartDone,
    CustomToolCallInputDelta,
    CustomToolCallInputDone,
    FunctionCallArgumentsDelta,
    FunctionCallArgumentsDone,
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

SDK_EVENT: TypeAdapter[ResponseStreamEvent] = TypeAdapter(ResponseStreamEvent)

LP = TokenLogprob("hé", -0.25, (("hé", -0.25), ("ha", -1.5)))
RECORD = ResponseRecord("resp_1", 1_700_000_000, "in_progress", RequestEcho(model="m"))
USAGE = Usage(input_tokens=5, output_tokens=3, cached_tokens=2, reasoning_tokens=1)
MESSAGE = Message("assistant", (OutputText("héllo", (LP,)),), id="msg_1")
CALL = FunctionCall("call_1", "f", '{"a": 1}', id="fc_1")
REASONING = Reasoning("hmm", id="rs_1")
COMPACTION = Compaction("summary", (MESSAGE,), id="cmp_1")


def finished(status: Any, **changes: Any) -> ResponseFinished:
    output = (REASONING, MESSAGE, CALL)
    return ResponseFinished(
        dataclasses.replace(RECORD, status=status, output=output, usage=USAGE, **changes)
    )


# One of each event (the terminal one once per status), its frame's `type`, and the SDK
# class that parses it (None: an `mlx.` extension the SDK does not know).
EVENTS: list[tuple[str, ResponseEvent, str, type[BaseModel] | None]] = [
    (
        "created",
        ResponseCreated(dataclasses.replace(RECORD, status="queued")),
        "response.created",
        ResponseCreatedEvent,
    ),
    ("in_progress", ResponseInProgress(RECORD), "response.in_progress", ResponseInProgressEvent),
    ("compaction_started", CompactionStarted("resp_1", 900), "mlx.compaction.started", None),
    (
        "compaction_completed",
        CompactionCompleted("resp_1", 900, 120),
        "mlx.compaction.completed",
        None,
    ),
    (
        "item_added",
        OutputItemAdded(
            "resp_1", 0, dataclasses.replace(MESSAGE, content=(), status="in_progress")
        ),
        "response.output_item.added",
        ResponseOutputItemAddedEvent,
    ),
    (
        "part_added",
        ContentPartAdded("resp_1", "msg_1", 0, 0, OutputText("")),
        "response.content_part.added",
        ResponseContentPartAddedEvent,
    ),
    (
        "text_delta",
        OutputTextDelta("resp_1", "msg_1", 0, 0, "hé", (LP,)),
        "response.output_text.delta",
        ResponseTextDeltaEvent,
    ),
    (
        "text_done",
        OutputTextDone("resp_1", "msg_1", 0, 0, "héllo"),
        "response.output_text.done",
        ResponseTextDoneEvent,
    ),
    (
        "part_done",
        ContentPartDone("resp_1", "msg_1", 0, 0, MESSAGE.content[0]),
        "response.content_part.done",
        ResponseContentPartDoneEvent,
    ),
    (
        "reasoning_delta",
        ReasoningTextDelta("resp_1", "rs_1", 1, 0, "hm"),
        "response.reasoning_text.delta",
        ResponseReasoningTextDeltaEvent,
    ),
    (
        "reasoning_done",
        ReasoningTextDone("resp_1", "rs_1", 1, 0, "hmm"),
        "response.reasoning_text.done",
        ResponseReasoningTextDoneEvent,
    ),
    (
        "arguments_delta",
        FunctionCallArgumentsDelta("resp_1", "fc_1", 2, '{"a"'),
        "response.function_call_arguments.delta",
        ResponseFunctionCallArgumentsDeltaEvent,
    ),
    (
        "arguments_done",
        FunctionCallArgumentsDone("resp_1", "fc_1", 2, '{"a": 1}'),
        "response.function_call_arguments.done",
        ResponseFunctionCallArgumentsDoneEvent,
    ),
    (
        "custom_input_delta",
        CustomToolCallInputDelta("resp_1", "ctc_1", 3, "*** Begin"),
        "response.custom_tool_call_input.delta",
        ResponseCustomToolCallInputDeltaEvent,
    ),
    (
        "custom_input_done",
        CustomToolCallInputDone("resp_1", "ctc_1", 3, "*** Begin Patch"),
        "response.custom_tool_call_input.done",
        ResponseCustomToolCallInputDoneEvent,
    ),
    (
        "item_done",
        OutputItemDone("resp_1", 2, CALL),
        "response.output_item.done",
        ResponseOutputItemDoneEvent,
    ),
    ("completed", finished("completed"), "response.completed", ResponseCompletedEvent),
    (
        "incomplete",
        finished("incomplete", incomplete_reason="max_output_tokens"),
        "response.incomplete",
        ResponseIncompleteEvent,
    ),
    (
        "failed",
        finished("failed", error=ResponseError("server_error", "boom")),
        "response.failed",
        ResponseFailedEvent,
    ),
    ("cancelled", finished("cancelled"), "response.failed", ResponseFailedEvent),
    ("error", StreamError("resp_1", "server_error", "boom"), "error", ResponseErrorEvent),
]


def sdk_event(body: dict[str, Any]) -> ResponseStreamEvent:
    """The frame's data validated as the SDK's event, but for one known gap: newer SDKs
    require `usage.input_tokens_details.cache_write_tokens`, which this server does not
    report (`test_usage_has_every_field_the_sdk_requires` fails until it does). The SDK
    itself builds events without validating them, so clients only miss the field."""
    response = body.get("response")
    if isinstance(response, dict) and isinstance(response.get("usage"), dict):
        details = response["usage"]["input_tokens_details"]
        if "cache_write_tokens" not in details:
            body = copy.deepcopy(body)
            body["response"]["usage"]["input_tokens_details"]["cache_write_tokens"] = 0
    return SDK_EVENT.validate_python(body)


def frames(data: bytes) -> list[tuple[str | None, dict[str, Any]]]:
    """(event name, data JSON) of each frame, as the SDK's SSE decoder splits them."""
    return [
        (sse.event, json.loads(sse.data, parse_constant=_no_constant))
        for sse in SSEDecoder().iter_bytes(iter([data]))
    ]


def _no_constant(name: str) -> Any:
    raise AssertionError(f"{name} is not JSON")


def encode_all(events: list[ResponseEvent]) -> bytes:
    encoder = SseEncoder(progress=False)
    return b"".join(encoder.encode(e) for e in events)
