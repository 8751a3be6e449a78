"""The SSE encoder: each response event as one typed, numbered frame.

Frames are read back the way clients read them: split by the `openai` SDK's own SSE
decoder, and their data validated as the SDK's `ResponseStreamEvent` union."""

from __future__ import annotations

import copy
import dataclasses
import json
import math
import typing
from typing import Any

import pytest
from openai._streaming import SSEDecoder
from openai.types.responses import (
    ResponseCompactionItem,
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
    ResponseFunctionToolCall,
    ResponseIncompleteEvent,
    ResponseInProgressEvent,
    ResponseOutputItemAddedEvent,
    ResponseOutputItemDoneEvent,
    ResponseOutputMessage,
    ResponseReasoningItem,
    ResponseReasoningTextDeltaEvent,
    ResponseReasoningTextDoneEvent,
    ResponseStreamEvent,
    ResponseTextDeltaEvent,
    ResponseTextDoneEvent,
)
from pydantic import BaseModel, TypeAdapter

from mlxcel.actors.events import (
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
    StreamError,
)
from mlxcel.actors.responses import ResponseBuilder
from mlxcel.generation import TokenStep, ToolUse
from mlxcel.http.sse import KEEPALIVE_FRAME, SseEncoder, event_json
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


def test_every_event_kind_is_covered() -> None:
    kinds = set(typing.get_args(ResponseEvent)) - {KeepAlive}
    assert {type(event) for _, event, _, _ in EVENTS} == kinds
    statuses = {e.record.status for _, e, _, _ in EVENTS if isinstance(e, ResponseFinished)}
    assert statuses == {"completed", "incomplete", "failed", "cancelled"}


def test_every_event_names_its_response() -> None:
    assert {e.response_id for _, e, _, _ in EVENTS} == {"resp_1"}
    assert KeepAlive("resp_1").response_id == "resp_1"


@pytest.mark.parametrize(
    ("event", "sdk_type"),
    [pytest.param(e, c, id=i) for i, e, _, c in EVENTS if c is not None],
)
def test_a_frame_sends_only_the_fields_of_its_sdk_event(
    event: ResponseEvent, sdk_type: type[BaseModel]
) -> None:
    """The response id the events carry inside the server is not one of the OpenAI
    event's fields: no frame sends it (nor anything else the SDK does not know)."""
    [(_, body)] = frames(SseEncoder().encode(event))
    assert "response_id" not in body
    assert set(body) <= set(sdk_type.model_fields)


@pytest.mark.parametrize(("event", "type_"), [pytest.param(e, t, id=i) for i, e, t, _ in EVENTS])
def test_each_event_is_one_frame_named_for_its_type(event: ResponseEvent, type_: str) -> None:
    frame = SseEncoder().encode(event)
    head, data, end = frame.split(b"\n", 2)
    assert head == f"event: {type_}".encode()
    assert data.startswith(b"data: ")
    assert end == b"\n"  # the blank line that ends the frame
    body = json.loads(data[len(b"data: ") :])
    assert body == {**event_json(event), "sequence_number": 0}
    assert body["type"] == type_


@pytest.mark.parametrize(
    ("event", "sdk_type"),
    [pytest.param(e, c, id=i) for i, e, _, c in EVENTS if c is not None],
)
def test_each_frame_is_the_sdk_event_of_its_type(
    event: ResponseEvent, sdk_type: type[BaseModel]
) -> None:
    [(name, body)] = frames(SseEncoder().encode(event))
    parsed = sdk_event(body)
    assert type(parsed) is sdk_type
    assert parsed.type == name
    assert parsed.sequence_number == 0


def test_the_sdk_reads_items_parts_and_logprobs_as_sent() -> None:
    stream = [e for _, e, _, c in EVENTS if c is not None]
    parsed = [sdk_event(body) for _, body in frames(encode_all(stream))]
    by_type = {p.type: p for p in parsed}

    delta = by_type["response.output_text.delta"]
    assert isinstance(delta, ResponseTextDeltaEvent)
    [logprob] = delta.logprobs
    assert (logprob.token, logprob.logprob) == ("hé", -0.25)
    assert [(t.token, t.logprob) for t in logprob.top_logprobs or []] == [
        ("hé", -0.25),
        ("ha", -1.5),
    ]

    done = by_type["response.output_item.done"]
    assert isinstance(done, ResponseOutputItemDoneEvent)
    assert isinstance(done.item, ResponseFunctionToolCall)
    assert (done.item.id, done.item.call_id, done.item.name) == ("fc_1", "call_1", "f")
    assert json.loads(done.item.arguments) == {"a": 1}

    completed = by_type["response.completed"]
    assert isinstance(completed, ResponseCompletedEvent)
    response = completed.response
    assert (response.id, response.status) == ("resp_1", "completed")
    reasoning, message, call = response.output
    assert isinstance(reasoning, ResponseReasoningItem)
    assert [c.text for c in reasoning.content or []] == ["hmm"]
    assert isinstance(message, ResponseOutputMessage)
    assert response.output_text == "héllo"
    assert isinstance(call, ResponseFunctionToolCall)
    assert response.usage is not None
    assert (response.usage.input_tokens, response.usage.output_tokens) == (5, 3)
    assert response.usage.input_tokens_details.cached_tokens == 2
    assert response.usage.output_tokens_details.reasoning_tokens == 1
    assert response.usage.total_tokens == 8


def test_a_cancelled_response_ends_the_stream_as_failed() -> None:
    [(name, body)] = frames(SseEncoder().encode(finished("cancelled")))
    assert name == "response.failed"
    parsed = sdk_event(body)
    assert isinstance(parsed, ResponseFailedEvent)
    assert parsed.response.status == "cancelled"


def test_a_compaction_item_is_the_sdk_compaction_item() -> None:
    [(_, body)] = frames(SseEncoder().encode(OutputItemDone("resp_1", 0, COMPACTION)))
    parsed = SDK_EVENT.validate_python(body)
    assert isinstance(parsed, ResponseOutputItemDoneEvent)
    assert isinstance(parsed.item, ResponseCompactionItem)
    assert parsed.item.id == "cmp_1"


def test_compaction_progress_events_carry_their_token_counts() -> None:
    stream: list[ResponseEvent] = [
        CompactionStarted("resp_1", 900),
        CompactionCompleted("resp_1", 900, 120),
    ]
    assert frames(encode_all(stream)) == [
        (
            "mlx.compaction.started",
            {
                "type": "mlx.compaction.started",
                "response_id": "resp_1",
                "input_tokens": 900,
                "sequence_number": 0,
            },
        ),
        (
            "mlx.compaction.completed",
            {
                "type": "mlx.compaction.completed",
                "response_id": "resp_1",
                "input_tokens_before": 900,
                "input_tokens_after": 120,
                "sequence_number": 1,
            },
        ),
    ]


def test_usage_has_every_field_the_sdk_requires() -> None:
    [(_, body)] = frames(SseEncoder().encode(finished("completed")))
    SDK_EVENT.validate_python(body)


# --- numbering and keep-alives -----------------------------------------------------


def test_sequence_numbers_count_from_zero_and_keep_alive_comments_take_none() -> None:
    stream: list[ResponseEvent] = [KeepAlive("resp_1")]
    for _, event, _, _ in EVENTS:
        stream += [event, KeepAlive("resp_1")] if len(stream) % 3 == 0 else [event]
    encoder = SseEncoder(progress=False)
    encoded = [encoder.encode(e) for e in stream]
    keepalives = [f for e, f in zip(stream, encoded, strict=True) if isinstance(e, KeepAlive)]
    assert len(keepalives) > 2
    assert set(keepalives) == {KEEPALIVE_FRAME}
    assert KEEPALIVE_FRAME.startswith(b":")  # an SSE comment: no event for a client
    numbers = [body["sequence_number"] for _, body in frames(b"".join(encoded))]
    assert numbers == list(range(len(EVENTS)))


def test_progress_events_are_numbered_with_the_others() -> None:
    stream: list[ResponseEvent] = [KeepAlive("resp_1", 2, 0, 40)]
    for _, event, _, _ in EVENTS:
        stream += [event, KeepAlive("resp_1", None, 7, 40)] if len(stream) % 3 == 0 else [event]
    parsed = frames(encode_all_with_progress(stream))
    assert [body["sequence_number"] for _, body in parsed] == list(range(len(stream)))
    progress = [body for name, body in parsed if name == "mlx.progress"]
    assert len(progress) > 2
    assert progress[0] == {
        "type": "mlx.progress",
        "response_id": "resp_1",
        "queue_position": 2,
        "prompt_tokens_read": 0,
        "prompt_tokens_total": 40,
        "sequence_number": 0,
    }
    assert {p["queue_position"] for p in progress[1:]} == {None}
    assert {p["prompt_tokens_read"] for p in progress[1:]} == {7}


def encode_all_with_progress(events: list[ResponseEvent]) -> bytes:
    encoder = SseEncoder()
    return b"".join(encoder.encode(e) for e in events)


def test_each_stream_numbers_its_own_events() -> None:
    first, second = SseEncoder(), SseEncoder()
    first.encode(ResponseInProgress(RECORD))
    first.encode(ResponseInProgress(RECORD))
    [(_, body)] = frames(second.encode(ResponseInProgress(RECORD)))
    assert body["sequence_number"] == 0
    [(_, body)] = frames(first.encode(ResponseInProgress(RECORD)))
    assert body["sequence_number"] == 2


INSIDE_AN_ITEM = (
    ResponseContentPartAddedEvent,
    ResponseContentPartDoneEvent,
    ResponseTextDeltaEvent,
    ResponseTextDoneEvent,
    ResponseReasoningTextDeltaEvent,
    ResponseReasoningTextDoneEvent,
    ResponseFunctionCallArgumentsDeltaEvent,
    ResponseFunctionCallArgumentsDoneEvent,
)


def test_a_whole_builder_stream_is_what_the_sdk_parses() -> None:
    """A real reply (reasoning, text, a call) streams as frames the SDK accepts, each item's
    events name the id and index it was added with, and the numbers run without a gap."""
    builder = ResponseBuilder(RECORD, 3, ToolUse(frozenset({"f"}), False), reasoning_opened=True)
    stream: list[ResponseEvent] = [ResponseCreated(dataclasses.replace(RECORD, status="queued"))]
    stream += builder.start()
    pieces = ["hmm", "</think>", "Sure ", '<tool_call>{"name": "f", "arguments": {"a": 1}}', ""]
    for i, text in enumerate(pieces):
        stream += builder.feed(TokenStep(1, i, text))
    stream += [KeepAlive("resp_1")]
    stream += builder.finish("stop")[0]
    stream += [ResponseFinished(builder.record)]
    parsed = [sdk_event(body) for _, body in frames(encode_all(stream))]
    assert [p.sequence_number for p in parsed] == list(range(len(stream) - 1))
    assert parsed[0].type == "response.created"
    assert parsed[-1].type == "response.completed"
    added = {
        p.output_index: p.item.id for p in parsed if isinstance(p, ResponseOutputItemAddedEvent)
    }
    assert len(added) == 3
    inside = [p for p in parsed if isinstance(p, INSIDE_AN_ITEM)]
    assert {p.type for p in inside} >= {
        "response.reasoning_text.delta",
        "response.output_text.delta",
        "response.function_call_arguments.done",
    }
    for p in inside:
        assert added[p.output_index] == p.item_id


# --- what JSON can and cannot carry ------------------------------------------------


@pytest.mark.parametrize("value", [math.nan, math.inf, -math.inf])
def test_a_number_json_cannot_carry_is_refused(value: float) -> None:
    record = dataclasses.replace(RECORD, echo=RequestEcho(model="m", temperature=value))
    with pytest.raises(ValueError, match="JSON"):
        SseEncoder().encode(ResponseInProgress(record))


@pytest.mark.parametrize("value", [math.nan, -math.inf])
def test_an_impossible_logprob_is_reported_as_the_floor_not_refused(value: float) -> None:
    entry = TokenLogprob("x", value, (("x", value),))
    [(_, body)] = frames(
        SseEncoder().encode(OutputTextDelta("resp_1", "msg_1", 0, 0, "x", (entry,)))
    )
    [logprob] = body["logprobs"]
    assert logprob["logprob"] == logprob["top_logprobs"][0]["logprob"] == -9999.0


def test_text_stays_utf8_and_never_breaks_a_frame() -> None:
    # Line ends of every kind inside the text, and a character some line splitters take
    # for one (U+2028, NEL): the data must stay one line of the frame.
    text = "héllo 世界 🎉\n\nevent: x\r\ndata: y\r\u2028\x85"
    frame = SseEncoder().encode(OutputTextDelta("resp_1", "msg_1", 0, 0, text))
    assert "世界 🎉".encode() in frame
    assert b"\\u" not in frame  # not escaped to ASCII
    assert frame.count(b"\n") == 3  # after the event line, after the data line, blank line
    assert b"\r" not in frame
    [(name, body)] = frames(frame)
    assert name == "response.output_text.delta"
    assert body["delta"] == text


def test_a_keep_alive_between_frames_is_skipped_by_the_sdk() -> None:
    encoder = SseEncoder(progress=False)
    data = b"".join(
        [
            encoder.encode(ResponseInProgress(RECORD)),
            encoder.encode(KeepAlive("resp_1")),
            encoder.encode(StreamError("resp_1", "server_error", "boom")),
        ]
    )
    assert [name for name, _ in frames(data)] == ["response.in_progress", "error"]
