"""From the Responses API's validated bodies to the plain parameters preparation reads."""

from __future__ import annotations

from mlxcel.http.item_schemas import to_entries
from mlxcel.http.schemas import CompactBody, CreateResponseBody
from mlxcel.prepare.params import CompactionParams, ResponseParams


def response_params(
    body: CreateResponseBody, *, model: str | None = None, tenant: str = ""
) -> ResponseParams:
    """`body` as parameters (its input converted to items: run it off the event loop);
    `model` stands in for a body that names none (`input_tokens`); `tenant` asks."""
    items, references = to_entries(body.input)
    return ResponseParams(
        model=body.model or model or "",
        input=items,
        references=references,
        instructions=body.instructions,
        max_output_tokens=body.max_output_tokens,
        temperature=body.temperature,
        top_p=body.top_p,
        top_logprobs=body.top_logprobs,
        presence_penalty=body.presence_penalty,
        frequency_penalty=body.frequency_penalty,
        store=body.store,
        background=bool(body.background),
        metadata=dict(body.metadata or {}),
        truncation=body.truncation,
        tools=tuple(body.tools) if body.tools is not None else None,
        tool_choice=body.tool_choice,
        parallel_tool_calls=body.parallel_tool_calls,
        text=body.text,
        reasoning=body.reasoning,
        previous_response_id=body.previous_response_id,
        conversation=body.conversation,
        user=body.user,
        prompt_cache_key=body.prompt_cache_key,
        include=tuple(body.include or ()),
        max_tool_calls=body.max_tool_calls,
        safety_identifier=body.safety_identifier,
        prompt_cache_retention=body.prompt_cache_retention,
        chat_template_kwargs=body.chat_template_kwargs,
        compact_threshold=body.compact_threshold,
        tenant=tenant,
    )


def compaction_params(body: CompactBody, *, tenant: str = "") -> CompactionParams:
    """`body` as parameters (its input converted to items: run it off the event loop);
    `stream` and `conversation` were refused before."""
    items, references = to_entries(body.input)
    return CompactionParams(
        model=body.model,
        input=items,
        references=references,
        instructions=body.instructions,
        previous_response_id=body.previous_response_id,
        keep_tokens=body.keep_tokens,
        max_output_tokens=body.max_output_tokens,
        tenant=tenant,
    )
