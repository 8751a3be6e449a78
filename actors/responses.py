"""Turns a sequence's token events into Responses output items and stream events.

One builder per response. It owns the item ids, so the ids streamed in events are the
ids of the final object, and it produces the final record (status, output, usage).
"""

from __future__ import annotations

import dataclasses
import time
from typing import Literal

from mlxcel.actors.messages import (
    ContentPartAdded,
    ContentPartDone,
    OutputItemAdded,
    OutputItemDone,
    OutputTextDelta,
    OutputTextDone,
    ResponseEvent,
    ResponseInProgress,
    StreamError,
)
from mlxcel.items import Message, OutputText, ResponseError, ResponseRecord, Usage, new_id
from mlxcel.model.engine import FinishReason, TokenStep


class ResponseBuilder:
    def __init__(self, record: ResponseRecord, prompt_tokens: int) -> None:
        self._record = dataclasses.replace(record, status="in_progress", output=(), usage=None)
        self._prompt_tokens = prompt_tokens
        self._message_id: str | None = None
        self._text: list[str] = []
        self._tokens = 0

    @property
    def record(self) -> ResponseRecord:
        return self._record

    def start(self) -> list[ResponseEvent]:
        """A slot took the response (the HTTP edge already announced it as created)."""
        return [ResponseInProgress(self._record)]

    def feed(self, step: TokenStep) -> list[ResponseEvent]:
        """Events for one generated token (none when it adds no text yet)."""
        self._tokens += 1
        events: list[ResponseEvent] = []
        if self._message_id is None:
            events.extend(self._open_message())
        if step.text:
            self._text.append(step.text)
            assert self._message_id is not None
            events.append(OutputTextDelta(self._message_id, 0, 0, step.text))
        return events

    def _open_message(self) -> list[ResponseEvent]:
        self._message_id = new_id("msg")
        item = Message("assistant", (), id=self._message_id, status="in_progress")
        return [
            OutputItemAdded(0, item),
            ContentPartAdded(self._message_id, 0, 0, OutputText("")),
        ]

    def finish(self, reason: FinishReason) -> tuple[list[ResponseEvent], ResponseRecord]:
        """The closing item events and the final record (not yet stored)."""
        events: list[ResponseEvent] = []
        if self._message_id is None:
            events.extend(self._open_message())
        assert self._message_id is not None
        text = "".join(self._text)
        part = OutputText(text)
        status: Literal["completed", "incomplete"] = (
            "completed" if reason == "stop" else "incomplete"
        )
        item = Message("assistant", (part,), id=self._message_id, status=status)
        events += [
            OutputTextDone(self._message_id, 0, 0, text),
            ContentPartDone(self._message_id, 0, 0, part),
            OutputItemDone(0, item),
        ]
        self._record = dataclasses.replace(
            self._record,
            status=status,
            output=(item,),
            usage=self._usage(),
            incomplete_reason=None if reason == "stop" else "max_output_tokens",
            completed_at=int(time.time()) if reason == "stop" else None,
        )
        return events, self._record

    def fail(self, code: str, message: str) -> tuple[list[ResponseEvent], ResponseRecord]:
        """A failed record (partial output is dropped) and the stream's error event."""
        self._record = dataclasses.replace(
            self._record,
            status="failed",
            output=(),
            usage=self._usage(),
            error=ResponseError(code, message),
        )
        return [StreamError(code, message)], self._record

    def cancel(self) -> ResponseRecord:
        """The record as cancelled; a response that already ended is returned unchanged."""
        if self._record.status in ("completed", "incomplete", "failed", "cancelled"):
            return self._record
        self._record = dataclasses.replace(self._record, status="cancelled", usage=self._usage())
        return self._record

    def _usage(self) -> Usage:
        return Usage(input_tokens=self._prompt_tokens, output_tokens=self._tokens)
