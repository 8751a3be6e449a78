"""`POST /v1/responses/compact`: a history becomes its kept system messages, its newest
turns and one `compaction` item."""

from __future__ import annotations

import time

from quart import Blueprint, Response

from mlxcel.errors import InvalidRequest
from mlxcel.http.access_log import exchange_note
from mlxcel.http.body import read_model
from mlxcel.http.guards import current_tenant
from mlxcel.http.handles import handles, json_response
from mlxcel.http.objects import item_json, usage_json
from mlxcel.http.params import compaction_params
from mlxcel.http.rate_limits import metered_generate, rate_limited
from mlxcel.http.schemas import CompactBody
from mlxcel.items import new_id
from mlxcel.prepare.front import prepare_compaction
from mlxcel.prepare.limits import check_item_count
from mlxcel.prepare.offload import off_loop

compact = Blueprint("compact", __name__)


@compact.post("/responses/compact")
@rate_limited
async def compact_history() -> Response:
    body = await read_model(CompactBody)
    h = handles()
    async with h.fleet.open_model(body.model) as lease:  # a 404 before any other answer
        model = lease.served()
        _check(body, model.info.context_length)
        params = await off_loop(compaction_params, body, tenant=current_tenant())
        compaction = await prepare_compaction(params, model, h.store)
        output, usage = await compaction.run(metered_generate(lease.generate))
    response_id = new_id("resp")
    exchange_note().response(response_id, usage)
    return json_response(
        {
            "id": response_id,
            "object": "response.compaction",
            "created_at": int(time.time()),
            "model": body.model,
            "output": [item_json(i) for i in output],
            "usage": usage_json(usage),
        }
    )


def _check(body: CompactBody, context_length: int) -> None:
    """The 400s a compaction body can earn before it is read into parameters."""
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
    check_item_count(body.input, context_length)  # before any work on the input
