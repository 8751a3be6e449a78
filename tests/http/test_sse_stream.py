"""The SSE encoder over a whole stream: sequence numbers, keep-alives and progress
events, a builder's whole reply, and what JSON can and cannot carry."""

from __future__ import annotations

import dataclasses
import math

import pytest
from openai.types.responses import (
    ResponseContentPartAddedEvent,
    ResponseContentPartDoneEvent,
    ResponseFunctionCallArgumentsDeltaEvent,
    ResponseFunctionCallArgumentsDoneEvent,
    ResponseOutputItemAddedEvent,
    ResponseReasoningTextDeltaEvent,
    ResponseReasoningTextDoneEvent,
    ResponseTextDeltaEvent,
    ResponseTextDoneEvent,
)

from mlxcel.generation import TokenStep, ToolUse
from mlxcel.http.sse import KEEPALIVE_FRAME, SseEncoder
from mlxcel.items import (
    RequestEcho,
    TokenLogprob,
)
from mlxcel.respond.builder import ResponseBuilder
from mlxcel.respond.events import (
    KeepAlive,
    OutputTextDelta,
    ResponseCreated,
    ResponseEvent,
    ResponseFinished,
    ResponseInProgress,
    StreamError,
)

from sse_frames import (
    EVENTS,
    RECORD,
    encode_all,
    frames,
    sdk_event,
)

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
