"""The JSON of Chat Completions and legacy Completions, made from the response pipeline's
records and events: `chat.completion`, `chat.completion.chunk` and `text_completion`.

A response's output items map onto one choice: its messages' text is the content, its
reasoning items the `reasoning_content`, its function calls the `tool_calls`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from mlxcel.errors import GenerationFailed
from mlxcel.http.objects import logprob_json
from mlxcel.items import (
    FunctionCall,
    Message,
    OutputText,
    Reasoning,
    ResponseRecord,
    TokenLogprob,
    Usage,
)
from mlxcel.respond.events import (
    FunctionCallArgumentsDelta,
    OutputItemAdded,
    OutputTextDelta,
    ReasoningTextDelta,
    ResponseEvent,
    ResponseFinished,
    StreamError,
)


def finish_reason(record: ResponseRecord) -> str:
    if record.status == "incomplete" and record.incomplete_reason == "max_output_tokens":
        return "length"
    if any(isinstance(item, FunctionCall) for item in record.output):
        return "tool_calls"
    return "stop"


def finished(record: ResponseRecord) -> ResponseRecord:
    """`record`, unless it failed: then the error a synchronous answer raises (500)."""
    if record.status == "failed":
        message = record.error.message if record.error else "The response failed."
        raise GenerationFailed(message, code=record.error.code if record.error else None)
    return record


def usage_json(usage: Usage | None) -> dict[str, Any]:
    usage = usage or Usage()
    return {
        "prompt_tokens": usage.input_tokens,
        "completion_tokens": usage.output_tokens,
        "total_tokens": usage.total_tokens,
        "prompt_tokens_details": {"cached_tokens": usage.cached_tokens},
        "completion_tokens_details": {"reasoning_tokens": usage.reasoning_tokens},
    }


def _logprobs(record: ResponseRecord) -> list[TokenLogprob]:
    return [
        entry
        for item in record.output
        if isinstance(item, Message)
        for part in item.content
        if isinstance(part, OutputText)
        for entry in part.logprobs
    ]


def _tool_call(call: FunctionCall, index: int | None = None) -> dict[str, Any]:
    out: dict[str, Any] = {} if index is None else {"index": index}
    function = {"name": call.name, "arguments": call.arguments}
    return out | {"id": call.call_id, "type": "function", "function": function}


def chat_completion(records: Sequence[ResponseRecord], *, logprobs: bool) -> dict[str, Any]:
    """The `chat.completion` object of finished responses, one choice each (`n`); the
    first one's id names it."""
    choices = [_chat_choice(record, i, logprobs) for i, record in enumerate(records)]
    return _envelope(records[0], "chat.completion", "chatcmpl") | {
        "choices": choices,
        "usage": usage_json(summed_usage([r.usage for r in records])),
    }


def _chat_choice(record: ResponseRecord, index: int, logprobs: bool) -> dict[str, Any]:
    calls = [item for item in record.output if isinstance(item, FunctionCall)]
    reasoning = "".join(item.text for item in record.output if isinstance(item, Reasoning))
    text = record.output_text
    message: dict[str, Any] = {
        "role": "assistant",
        "content": text if text or not calls else None,
        "refusal": None,
    }
    if calls:
        message["tool_calls"] = [_tool_call(call) for call in calls]
    if reasoning:
        message["reasoning_content"] = reasoning
    return {
        "index": index,
        "message": message,
        "logprobs": _chat_logprobs(_logprobs(record)) if logprobs else None,
        "finish_reason": finish_reason(record),
    }


def summed_usage(usages: Sequence[Usage | None]) -> Usage:
    """The usage of `n` choices on one prompt, as OpenAI counts it: the prompt once,
    the completions' tokens summed."""
    first = usages[0] or Usage()
    rest = [u or Usage() for u in usages]
    return Usage(
        input_tokens=first.input_tokens,
        output_tokens=sum(u.output_tokens for u in rest),
        cached_tokens=first.cached_tokens,
        reasoning_tokens=sum(u.reasoning_tokens for u in rest),
        cache_write_tokens=first.cache_write_tokens,
    )


def _chat_logprobs(entries: list[TokenLogprob]) -> dict[str, Any]:
    return {"content": [logprob_json(e) for e in entries], "refusal": None}


def _envelope(record: ResponseRecord, kind: str, prefix: str) -> dict[str, Any]:
    return {
        "id": f"{prefix}-{record.id.removeprefix('resp_')}",
        "object": kind,
        "created": record.created_at,
        "model": record.echo.model,
        "system_fingerprint": None,
    }


def error_chunk(event: StreamError) -> dict[str, Any]:
    """A failure mid-stream, as the SDK raises it (`APIError`)."""
    error = {"message": event.message, "type": "server_error", "param": None, "code": event.code}
    return {"error": error}


@dataclass
class ChatChunks:
    """One response's events as `chat.completion.chunk` objects."""

    record: ResponseRecord
    include_usage: bool
    logprobs: bool
    index: int = 0
    """The choice these chunks are of."""
    final_usage: bool = True
    """The usage chunk follows the finish (off for one of `n` choices: it is summed)."""
    _calls: dict[str, int] = field(default_factory=dict)
    """Each function call's item id, to its index in `tool_calls`."""

    def first(self) -> dict[str, Any]:
        return self._chunk({"role": "assistant", "content": ""})

    def translate(self, event: ResponseEvent) -> list[dict[str, Any]]:
        match event:
            case ReasoningTextDelta(delta=delta):
                return [self._chunk({"reasoning_content": delta})]
            case OutputTextDelta(delta=delta, logprobs=entries):
                found = _chat_logprobs(list(entries)) if self.logprobs else None
                return [self._chunk({"content": delta}, logprobs=found)]
            case OutputItemAdded(item=FunctionCall() as call) if call.id is not None:
                index = self._calls[call.id] = len(self._calls)
                return [self._chunk({"tool_calls": [_tool_call(call, index)]})]
            case FunctionCallArgumentsDelta(item_id=item_id, delta=delta):
                more = {"index": self._calls[item_id], "function": {"arguments": delta}}
                return [self._chunk({"tool_calls": [more]})]
            case StreamError():
                return [error_chunk(event)]
            case ResponseFinished(record=record) if record.status != "failed":
                last = [self._chunk({}, finish=finish_reason(record))]
                if self.include_usage and self.final_usage:
                    last.append(self.usage_chunk(record.usage))
                return last
        return []

    def usage_chunk(self, usage: Usage | None) -> dict[str, Any]:
        return self._envelope() | {"choices": [], "usage": usage_json(usage)}

    def _envelope(self) -> dict[str, Any]:
        out = _envelope(self.record, "chat.completion.chunk", "chatcmpl")
        return out | ({"usage": None} if self.include_usage else {})

    def _chunk(
        self, delta: dict[str, Any], *, finish: str | None = None, logprobs: Any = None
    ) -> dict[str, Any]:
        choice = {
            "index": self.index,
            "delta": delta,
            "logprobs": logprobs,
            "finish_reason": finish,
        }
        return self._envelope() | {"choices": [choice]}


# --- legacy completions -------------------------------------------------------------


def text_completion(
    records: Sequence[ResponseRecord], *, prefix: str, logprobs: bool
) -> dict[str, Any]:
    """The `text_completion` object of finished responses, one choice each (`n`);
    `prefix` is the echoed prompt."""
    choices = []
    for index, record in enumerate(records):
        found = _text_logprobs(_logprobs(record), len(prefix)) if logprobs else None
        text = prefix + record.output_text
        finish = finish_reason(record)
        choices.append({"text": text, "index": index, "logprobs": found, "finish_reason": finish})
    return _envelope(records[0], "text_completion", "cmpl") | {
        "choices": choices,
        "usage": _text_usage(summed_usage([r.usage for r in records])),
    }


def _text_usage(usage: Usage | None) -> dict[str, Any]:
    found = usage_json(usage)
    return {k: found[k] for k in ("prompt_tokens", "completion_tokens", "total_tokens")}


def _text_logprobs(entries: list[TokenLogprob], offset: int) -> dict[str, Any]:
    offsets: list[int] = []
    for entry in entries:
        offsets.append(offset)
        offset += len(entry.token)
    return {
        "tokens": [e.token for e in entries],
        "token_logprobs": [logprob_json(e)["logprob"] for e in entries],
        "top_logprobs": [
            {t["token"]: t["logprob"] for t in logprob_json(e)["top_logprobs"]} for e in entries
        ],
        "text_offset": offsets,
    }


@dataclass
class TextChunks:
    """One response's events as streamed `text_completion` objects."""

    record: ResponseRecord
    include_usage: bool
    logprobs: bool
    prefix: str = ""
    """The echoed prompt, sent first."""
    index: int = 0
    final_usage: bool = True
    _offset: int = 0

    def first(self) -> dict[str, Any] | None:
        self._offset = len(self.prefix)
        return self._chunk(self.prefix) if self.prefix else None

    def translate(self, event: ResponseEvent) -> list[dict[str, Any]]:
        match event:
            case OutputTextDelta(delta=delta, logprobs=entries):
                found = _text_logprobs(list(entries), self._offset) if self.logprobs else None
                self._offset += len(delta)
                return [self._chunk(delta, logprobs=found)]
            case StreamError():
                return [error_chunk(event)]
            case ResponseFinished(record=record) if record.status != "failed":
                last = [self._chunk("", finish=finish_reason(record))]
                if self.include_usage and self.final_usage:
                    last.append(self.usage_chunk(record.usage))
                return last
        return []

    def usage_chunk(self, usage: Usage | None) -> dict[str, Any]:
        return self._envelope() | {"choices": [], "usage": _text_usage(usage)}

    def _envelope(self) -> dict[str, Any]:
        out = _envelope(self.record, "text_completion", "cmpl")
        return out | ({"usage": None} if self.include_usage else {})

    def _chunk(
        self, text: str, *, finish: str | None = None, logprobs: Any = None
    ) -> dict[str, Any]:
        choice = {"text": text, "index": self.index, "logprobs": logprobs, "finish_reason": finish}
        return self._envelope() | {"choices": [choice]}
