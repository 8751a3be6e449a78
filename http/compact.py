"""`POST /v1/responses/compact`: a history becomes its kept system messages, its newest
turns and one `compaction` item."""

from __future__ import annotations

import time

from quart import Blueprint, Response

from mlxcel.errors import ContextLengthExceeded, InvalidRequest
from mlxcel.http.access_log import exchange_note
from mlxcel.http.body import read_model
from mlxcel.http.guards import current_tenant
from mlxcel.http.handles import handles, json_response
from mlxcel.http.item_schemas import to_entries
from mlxcel.http.objects import item_json, usage_json
from mlxcel.http.rate_limits import metered_generate, rate_limited
from mlxcel.http.schemas import CompactBody
from mlxcel.items import Item, new_id
from mlxcel.prepare.compaction import Compactor, check_reduction, rendered_tokens
from mlxcel.prepare.history import read_history, resolve_items
from mlxcel.prepare.intake import check_model, input_items
from mlxcel.prepare.limits import check_item_count
from mlxcel.prepare.offload import off_loop

compact = Blueprint("compact", __name__)


@compact.post("/responses/compact")
@rate_limited
async def compact_history() -> Response:
    body = await read_model(CompactBody)
    h = handles()
    check_model(h.names, body.model)
    model = h.served()
    info, codec = model.info, model.codec
    _check(body, info.context_length)
    tenant = current_tenant()
    history = await read_history(body, h.store, tenant)
    sent, references = await off_loop(to_entries, body.input)
    raw = await resolve_items(sent, references, h.store, tenant)
    items = history + await off_loop(
        input_items, raw, body.instructions, None, history, info.context_length
    )
    before = await off_loop(rendered_tokens, codec, items)
    if before > info.context_length:
        raise ContextLengthExceeded(
            f"The history is {before} tokens, longer than the {info.context_length}-token "
            "context window, so it cannot be summarised in one pass."
        )
    generate = metered_generate(h.scheduler.generate)
    compactor = Compactor(generate, model, tenant)
    compacted = await compactor.compact(
        items,
        instructions=body.instructions,
        keep_tokens=body.keep_tokens,
        max_output_tokens=body.max_output_tokens,
    )
    output: tuple[Item, ...] = (*compacted.kept, *compacted.item.preserved, compacted.item)
    after = await off_loop(rendered_tokens, codec, output)
    check_reduction(before, after, info.context_length)
    response_id = new_id("resp")
    exchange_note().response(response_id, compacted.usage)
    return json_response(
        {
            "id": response_id,
            "object": "response.compaction",
            "created_at": int(time.time()),
            "model": body.model,
            "output": [item_json(i) for i in output],
            "usage": usage_json(compacted.usage),
        }
    )


def _check(body: CompactBody, context_length: int) -> None:
    """The 400s a compaction body can earn before any work on its history."""
    if body.stream:
        raise InvalidRequest(
            "Compaction does not stream.", param="stream", code="unsupported_value"
        )
    if body.conversation is not None:
        raise InvalidRequest(
            "Compaction takes its history from 'input' or 'previous_response_id', "
            "not from a conversation.",
            param="conversation",
            code="unsupported_parameter",
        )
    check_item_count(body.input, context_length)
    if body.keep_tokens is not None and body.keep_tokens >= context_length:
        raise InvalidRequest(
            f"'keep_tokens' must be below the {context_length}-token context window: "
            "the preserved turns and the summary must fit it together.",
            param="keep_tokens",
            code="invalid_value",
        )
