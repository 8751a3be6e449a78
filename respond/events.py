"""The response stream's events: what a response builder reports, what the scheduler
relays to the HTTP layer, and what `http/sse.py` encodes as server-sent events.

Every event names the response it belongs to (`response_id`): the item events carry it
as a field, the events that carry the whole record take it from the record. It is for
routing and logging inside the server; the SSE frames leave it out (the OpenAI events
have no such field), except the `mlx.compaction.*` ones, which always sent it.
"""

from __future__ import annotations

from dataclasses import dataclass

from mlxcel.items import ContentPart, Item, ResponseRecord, TokenLogprob


@dataclass(frozen=True, slots=True)
class ResponseCreated:
    record: ResponseRecord

    @property
    def response_id(self) -> str:
        return self.record.id


@dataclass(frozen=True, slots=True)
class ResponseQueued:
    """A background response waits for a slot: the second frame of its event log (never
    relayed by the scheduler, so not one of `ResponseEvent`)."""

    record: ResponseRecord

    @property
    def response_id(self) -> str:
        return self.record.id


@dataclass(frozen=True, slots=True)
class ResponseInProgress:
    record: ResponseRecord

    @property
    def response_id(self) -> str:
        return self.record.id


@dataclass(frozen=True, slots=True)
class CompactionStarted:
    """`mlx.compaction.started`: the rendered input reached the compaction threshold."""

    response_id: str
    input_tokens: int


@dataclass(frozen=True, slots=True)
class CompactionCompleted:
    """`mlx.compaction.completed`: the history now renders to `input_tokens_after`."""

    response_id: str
    input_tokens_before: int
    input_tokens_after: int


@dataclass(frozen=True, slots=True)
class OutputItemAdded:
    response_id: str
    output_index: int
    item: Item


@dataclass(frozen=True, slots=True)
class ContentPartAdded:
    response_id: str
    item_id: str
    output_index: int
    content_index: int
    part: ContentPart


@dataclass(frozen=True, slots=True)
class OutputTextDelta:
    response_id: str
    item_id: str
    output_index: int
    content_index: int
    delta: str
    logprobs: tuple[TokenLogprob, ...] = ()


@dataclass(frozen=True, slots=True)
class OutputTextDone:
    response_id: str
    item_id: str
    output_index: int
    content_index: int
    text: str


@dataclass(frozen=True, slots=True)
class ContentPartDone:
    response_id: str
    item_id: str
    output_index: int
    content_index: int
    part: ContentPart


@dataclass(frozen=True, slots=True)
class ReasoningTextDelta:
    response_id: str
    item_id: str
    output_index: int
    content_index: int
    delta: str


@dataclass(frozen=True, slots=True)
class ReasoningTextDone:
    response_id: str
    item_id: str
    output_index: int
    content_index: int
    text: str


@dataclass(frozen=True, slots=True)
class FunctionCallArgumentsDelta:
    response_id: str
    item_id: str
    output_index: int
    delta: str


@dataclass(frozen=True, slots=True)
class FunctionCallArgumentsDone:
    response_id: str
    item_id: str
    output_index: int
    arguments: str


@dataclass(frozen=True, slots=True)
class CustomToolCallInputDelta:
    response_id: str
    item_id: str
    output_index: int
    delta: str


@dataclass(frozen=True, slots=True)
class CustomToolCallInputDone:
    response_id: str
    item_id: str
    output_index: int
    input: str


@dataclass(frozen=True, slots=True)
class OutputItemDone:
    response_id: str
    output_index: int
    item: Item


@dataclass(frozen=True, slots=True)
class ResponseFinished:
    """The terminal event: the record's status says completed, incomplete or failed.
    The record is already stored when this is sent."""

    record: ResponseRecord

    @property
    def response_id(self) -> str:
        return self.record.id


@dataclass(frozen=True, slots=True)
class StreamError:
    """A failure after the stream opened; `ResponseFinished` (failed) follows it."""

    response_id: str
    code: str
    message: str


@dataclass(frozen=True, slots=True)
class KeepAlive:
    """Nothing was sent for a while (the response waits for a slot, or its prompt is long):
    keeps proxies and clients patient, and says how far the response got (`mlx.progress`)."""

    response_id: str
    queue_position: int | None = None
    """While the response waits for a slot: its place in the line, 1 being next."""
    prompt_tokens_read: int = 0
    """Prompt tokens in the sequence's KV state so far (those from the prompt cache too)."""
    prompt_tokens_total: int = 0


@dataclass(frozen=True, slots=True)
class PromptRead:
    """The prompt is read and the first token drawn: how much of it the prompt cache
    served and kept. Only for wire formats that show it before the end (Anthropic's
    `message_start`); no Responses frame and no event log carry it."""

    response_id: str
    prompt_tokens: int
    cached_tokens: int
    cache_write_tokens: int


ResponseEvent = (
    ResponseCreated
    | ResponseInProgress
    | PromptRead
    | CompactionStarted
    | CompactionCompleted
    | OutputItemAdded
    | ContentPartAdded
    | OutputTextDelta
    | OutputTextDone
    | ContentPartDone
    | ReasoningTextDelta
    | ReasoningTextDone
    | FunctionCallArgumentsDelta
    | FunctionCallArgumentsDone
    | CustomToolCallInputDelta
    | CustomToolCallInputDone
    | OutputItemDone
    | ResponseFinished
    | StreamError
    | KeepAlive
)
