"""The front door of preparation: one call per kind of request, from its parameters and
the served model to the one command its route submits.

A route reads its body into parameters and hands them here, so the order of the steps
(screening, item references, history, intake, the build) is written once, and a new wire
format adds a call rather than a copy.
"""

from __future__ import annotations

from mlxcel.errors import ContextLengthExceeded, InvalidRequest
from mlxcel.generation import GenerationRequest, ServedModel
from mlxcel.items import Item
from mlxcel.prepare.compaction import CompactionRequest, rendered_tokens
from mlxcel.prepare.context_management import build_managed
from mlxcel.prepare.history import (
    check_call_outputs,
    read_chain,
    read_history,
    resolve_items,
    resolve_references,
)
from mlxcel.prepare.intake import build_request, input_items, intake_items, render
from mlxcel.prepare.offload import off_loop
from mlxcel.prepare.params import CompactionParams, ResponseParams
from mlxcel.prepare.policy import ClientPolicy, screen
from mlxcel.store import EchoHandle, StoreHandle


async def prepare_response(
    params: ResponseParams,
    model: ServedModel,
    *,
    policy: ClientPolicy,
    store: StoreHandle,
    echo: EchoHandle,
) -> GenerationRequest:
    """A Responses API request as the request to generate, after the turns it continues;
    under `context_management`, with the compaction its slot runs first if it needs one."""
    params, history, items = await _intake(params, model, policy, store, echo)
    if params.compact_threshold is not None:  # compaction is the slot's first phase
        return await build_managed(params, model, history, items, check_now=not params.background)
    return await off_loop(build_request, params, model, history, items)


async def input_token_count(
    params: ResponseParams,
    model: ServedModel,
    *,
    policy: ClientPolicy,
    store: StoreHandle,
    echo: EchoHandle,
) -> int:
    """The prompt tokens a Responses API request renders to, prepared as it would be."""
    params, history, items = await _intake(params, model, policy, store, echo)
    context_length = model.info.context_length
    _, prompt, _ = await off_loop(
        render, params, history, model.codec, items, context_length=context_length
    )
    return len(prompt)


async def prepare_chat(
    params: ResponseParams, model: ServedModel, *, policy: ClientPolicy, echo: EchoHandle
) -> GenerationRequest:
    """A request that names no history (Chat Completions, legacy Completions) as the
    request to generate, prepared as a response is."""
    params = await off_loop(screen, params, policy, model.info)
    items = await intake_items(params, model, (), echo)
    return await off_loop(build_request, params, model, (), items)


async def prepare_compaction(
    params: CompactionParams, model: ServedModel, store: StoreHandle
) -> CompactionRequest:
    """A history to compact (the chain continued, then the input), checked against the
    window. The route has matched the model's name first (a 404 before any other)."""
    context_length = model.info.context_length
    if params.keep_tokens is not None and params.keep_tokens >= context_length:
        raise InvalidRequest(
            f"'keep_tokens' must be below the {context_length}-token context window: "
            "the preserved turns and the summary must fit it together.",
            param="keep_tokens",
            code="invalid_value",
        )
    history = await read_chain(params.previous_response_id, store, params.tenant)
    sent = await resolve_items(params.input, params.references, store, params.tenant)
    items = history + await off_loop(
        input_items, sent, params.instructions, None, history, context_length
    )
    before = await off_loop(rendered_tokens, model.codec, items)
    if before > context_length:
        raise ContextLengthExceeded(
            f"The history is {before} tokens, longer than the {context_length}-token "
            "context window, so it cannot be summarised in one pass."
        )
    return CompactionRequest(
        model,
        items,
        before,
        instructions=params.instructions,
        keep_tokens=params.keep_tokens,
        max_output_tokens=params.max_output_tokens,
        tenant=params.tenant,
    )


async def _intake(
    params: ResponseParams,
    model: ServedModel,
    policy: ClientPolicy,
    store: StoreHandle,
    echo: EchoHandle,
) -> tuple[ResponseParams, tuple[Item, ...], tuple[Item, ...]]:
    """The request as this server serves it (hosted tools and images under its policy,
    item references resolved), the turns it continues, and its checked input items."""
    params = await off_loop(screen, params, policy, model.info)
    params = await resolve_references(params, store)
    history = await read_history(params, store, params.tenant)
    check_call_outputs(history, params.input)
    items = await intake_items(params, model, history, echo)
    return params, history, items
