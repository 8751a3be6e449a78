"""The API's objects as JSON: responses, items, content parts, conversations.

The shapes follow the `openai` SDK's types, which is what real clients parse.
"""

from __future__ import annotations

import base64
import json
from typing import Any

from mlxcel.items import (
    Compaction,
    ContentPart,
    Conversation,
    FunctionCall,
    FunctionCallOutput,
    InputImage,
    InputText,
    Item,
    JsonValue,
    Message,
    OutputText,
    Reasoning,
    Refusal,
    ResponseRecord,
    TokenLogprob,
    Usage,
    conversation_shown_id,
)


def conversation_json(conversation: Conversation) -> dict[str, Any]:
    return {
        "id": conversation_shown_id(conversation.id),
        "object": "conversation",
        "created_at": conversation.created_at,
        "metadata": conversation.metadata,
    }


LOGPROB_FLOOR = -9999.0
"""The log-probability reported for a token the sampler could never pick (a grammar masks
it to -inf): JSON has no infinity, and the hosted API reports such tokens the same way."""


def logprob_json(entry: TokenLogprob) -> dict[str, Any]:
    return {
        "token": entry.token,
        "logprob": _finite(entry.logprob),
        "bytes": list(entry.token.encode()),
        "top_logprobs": [
            {"token": token, "logprob": _finite(value), "bytes": list(token.encode())}
            for token, value in entry.top
        ],
    }


def _finite(logprob: float) -> float:
    # NaN compares false, so it takes the floor too.
    return logprob if logprob >= LOGPROB_FLOOR else LOGPROB_FLOOR


def part_json(part: ContentPart) -> dict[str, Any]:
    match part:
        case OutputText(text=text, logprobs=logprobs):
            return {
                "type": "output_text",
                "text": text,
                "annotations": [],
                "logprobs": [logprob_json(e) for e in logprobs],
            }
        case InputText(text=text):
            return {"type": "input_text", "text": text}
        case Refusal(refusal=refusal):
            return {"type": "refusal", "refusal": refusal}
        case InputImage(image_url=url, file_id=file_id, detail=detail):
            return {"type": "input_image", "image_url": url, "file_id": file_id, "detail": detail}
    raise AssertionError(part)


REASONING_PREFIX = "mlx-reasoning."
"""Marks an `encrypted_content` this server wrote: the trace as base64url, not encrypted
(its text is in `content` too); a client sends it back when it keeps no other state."""


def reasoning_content(text: str) -> str:
    """A trace as the `encrypted_content` a client may send back (`include`)."""
    return REASONING_PREFIX + base64.urlsafe_b64encode(text.encode()).decode().rstrip("=")


def item_json(item: Item, *, encrypted: bool = False) -> dict[str, Any]:
    """The item's JSON; `encrypted`: a reasoning item carries `encrypted_content`."""
    match item:
        case Message():
            return {
                "id": item.id,
                "type": "message",
                "role": item.role,
                "status": item.status,
                "content": [part_json(p) for p in item.content],
            }
        case FunctionCall(custom=True):
            call = {
                "id": item.id,
                "type": "custom_tool_call",
                "call_id": item.call_id,
                "name": item.name,
                "input": item.arguments,
                "status": item.status,
            }
            return call | ({"namespace": item.namespace} if item.namespace else {})
        case FunctionCall():
            call = {
                "id": item.id,
                "type": "function_call",
                "call_id": item.call_id,
                "name": item.name,
                "arguments": item.arguments,
                "status": item.status,
            }
            return call | ({"namespace": item.namespace} if item.namespace else {})
        case FunctionCallOutput():
            return {
                "id": item.id,
                "type": "custom_tool_call_output" if item.custom else "function_call_output",
                "call_id": item.call_id,
                "output": item.output if item.parts is None else [part_json(p) for p in item.parts],
            }
        case Compaction():
            content = {"summary": item.summary, "preserved": [item_json(i) for i in item.preserved]}
            encoded = base64.urlsafe_b64encode(json.dumps(content).encode()).rstrip(b"=")
            return {"id": item.id, "type": "compaction", "encrypted_content": encoded.decode()}
        case Reasoning():
            reasoning = {
                "id": item.id,
                "type": "reasoning",
                "summary": [],
                "content": [{"type": "reasoning_text", "text": item.text}],
                "status": item.status,
            }
            if encrypted:
                reasoning["encrypted_content"] = reasoning_content(item.text)
            return reasoning
    raise AssertionError(item)


def response_json(record: ResponseRecord) -> dict[str, Any]:
    """The Responses API object for a record, as the `openai` SDK's `Response` parses it."""
    echo = record.echo
    usage = record.usage
    encrypted = "reasoning.encrypted_content" in echo.include
    body: dict[str, Any] = {
        "id": record.id,
        "object": "response",
        "created_at": record.created_at,
        "status": record.status,
        "completed_at": record.completed_at,
        "error": (
            {"code": record.error.code, "message": record.error.message} if record.error else None
        ),
        "incomplete_details": (
            {"reason": record.incomplete_reason} if record.incomplete_reason else None
        ),
        "instructions": echo.instructions,
        "max_output_tokens": echo.max_output_tokens,
        "model": echo.model,
        "output": [item_json(i, encrypted=encrypted) for i in record.output],
        "parallel_tool_calls": echo.parallel_tool_calls,
        "previous_response_id": echo.previous_response_id,
        "reasoning": echo.reasoning
        if echo.reasoning is not None
        else {"effort": None, "summary": None},
        "store": record.store,
        "background": record.background,
        "temperature": echo.temperature,
        "text": echo.text,
        "tool_choice": echo.tool_choice,
        "tools": [tool_json(tool) for tool in echo.tools],
        "top_logprobs": echo.top_logprobs,
        "top_p": echo.top_p,
        "presence_penalty": echo.presence_penalty,
        "frequency_penalty": echo.frequency_penalty,
        "truncation": echo.truncation,
        "usage": None if usage is None else usage_json(usage),
        "user": echo.user,
        "metadata": echo.metadata,
        "max_tool_calls": echo.max_tool_calls,
        # One way of serving here: whatever tier was asked, it ran as the standard one.
        "service_tier": "default",
        "safety_identifier": echo.safety_identifier,
        "prompt_cache_key": echo.prompt_cache_key,
        "prompt_cache_retention": echo.prompt_cache_retention,
    }
    if echo.conversation_id is not None:
        body["conversation"] = {"id": echo.conversation_id}
    return body


STRICT_DEFAULT = True
"""A function tool's `strict` when the request leaves it out (or sends null): the API's
documented default. It is echoed, not enforced: see README.md, "Function tools"."""


def tool_json(tool: JsonValue) -> JsonValue:
    """An echoed tool as the client sent it; a function tool always shows `strict`, which
    the API's schema requires of it."""
    if isinstance(tool, dict) and tool.get("type") == "function" and tool.get("strict") is None:
        return {**tool, "strict": STRICT_DEFAULT}
    return tool


def usage_json(usage: Usage) -> dict[str, Any]:
    return {
        "input_tokens": usage.input_tokens,
        "input_tokens_details": {
            "cached_tokens": usage.cached_tokens,
            "cache_write_tokens": usage.cache_write_tokens,
        },
        "output_tokens": usage.output_tokens,
        "output_tokens_details": {"reasoning_tokens": usage.reasoning_tokens},
        "total_tokens": usage.total_tokens,
    }
