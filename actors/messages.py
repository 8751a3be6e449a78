"""The message catalogue: every command an actor accepts and every event it reports.

Commands are named for what they ask (`Generate`, `PutResponse`), events for what they
report (`OutputTextDelta`, `ResponseFinished`). Replies travel on a channel the command
brings; the producer closes it when done.
"""

from __future__ import annotations

from dataclasses import dataclass

import trio

from mlxcel.items import ContentPart, Item, ResponseRecord
from mlxcel.model.engine import Sampling

# --- scheduler ---------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class GenerationRequest:
    """A validated, rendered request: everything the scheduler needs to run it."""

    record: ResponseRecord
    """The response as created: id, created_at, echo, input items; status in_progress."""
    prompt: tuple[int, ...]
    sampling: Sampling


@dataclass(frozen=True, slots=True)
class Generate:
    request: GenerationRequest
    reply: trio.MemorySendChannel[ResponseEvent]


# --- response events (scheduler -> HTTP) -------------------------------------------


@dataclass(frozen=True, slots=True)
class ResponseCreated:
    record: ResponseRecord


@dataclass(frozen=True, slots=True)
class ResponseInProgress:
    record: ResponseRecord


@dataclass(frozen=True, slots=True)
class OutputItemAdded:
    output_index: int
    item: Item


@dataclass(frozen=True, slots=True)
class ContentPartAdded:
    item_id: str
    output_index: int
    content_index: int
    part: ContentPart


@dataclass(frozen=True, slots=True)
class OutputTextDelta:
    item_id: str
    output_index: int
    content_index: int
    delta: str


@dataclass(frozen=True, slots=True)
class OutputTextDone:
    item_id: str
    output_index: int
    content_index: int
    text: str


@dataclass(frozen=True, slots=True)
class ContentPartDone:
    item_id: str
    output_index: int
    content_index: int
    part: ContentPart


@dataclass(frozen=True, slots=True)
class OutputItemDone:
    output_index: int
    item: Item


@dataclass(frozen=True, slots=True)
class ResponseFinished:
    """The terminal event: the record's status says completed, incomplete or failed.
    The record is already stored when this is sent."""

    record: ResponseRecord


@dataclass(frozen=True, slots=True)
class StreamError:
    """A failure after the stream opened; `ResponseFinished` (failed) follows it."""

    code: str
    message: str


@dataclass(frozen=True, slots=True)
class KeepAlive:
    """Nothing happened for a while (a long prefill); keeps proxies and clients patient."""


ResponseEvent = (
    ResponseCreated
    | ResponseInProgress
    | OutputItemAdded
    | ContentPartAdded
    | OutputTextDelta
    | OutputTextDone
    | ContentPartDone
    | OutputItemDone
    | ResponseFinished
    | StreamError
    | KeepAlive
)

# --- store -------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class PutResponse:
    record: ResponseRecord
    reply: trio.MemorySendChannel[bool]
    """Receives True once stored (False when the store retains nothing)."""


@dataclass(frozen=True, slots=True)
class GetResponse:
    response_id: str
    reply: trio.MemorySendChannel[ResponseRecord | None]


@dataclass(frozen=True, slots=True)
class DeleteResponse:
    response_id: str
    reply: trio.MemorySendChannel[bool]


StoreCommand = PutResponse | GetResponse | DeleteResponse
