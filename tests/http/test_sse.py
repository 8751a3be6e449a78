"""The SSE encoder: each response event as one typed frame, shaped as the SDK's event.

Frames are read back the way clients read them: split by the `openai` SDK's own SSE
decoder, and their data validated as the SDK's `ResponseStreamEvent` union."""

from __future__ import annotations

import json
import typing

import pytest
from openai.types.responses import (
    ResponseCompactionItem,
    ResponseCompletedEvent,
    ResponseFailedEvent,
    ResponseFunctionToolCall,
    ResponseOutputItemDoneEvent,
    ResponseOutputMessage,
    ResponseReasoningItem,
    ResponseTextDeltaEvent,
)
from pydantic import BaseModel

from mlxcel.http.sse import SseEncoder, event_json
from mlxcel.respond.events import (
    CompactionCompleted,
    CompactionStarted,
    KeepAlive,
    OutputItemDone,
    PromptRead,
    ResponseEvent,
    ResponseFinished,
)

from sse_frames import (
    COMPACTION,
    EVENTS,
    SDK_EVENT,
    encode_all,
    finished,
    frames,
    sdk_event,
)


def test_every_event_kind_is_covered() -> None:
    # PromptRead has no Responses frame: the stream skips it (Anthropic's message_start
    # shows it), and its usage is in the finished response.
    kinds = set(typing.get_args(ResponseEvent)) - {KeepAlive, PromptRead}
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
