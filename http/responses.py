"""`POST /v1/responses` and `/v1/responses/input_tokens`: body → prepare → one command.

Synchronous requests wait for the final record; streaming ones are a dumb pipe from the
response stream to SSE frames; background ones answer their `queued` record at once.
"""

from __future__ import annotations

from quart import Blueprint, Response

from mlxcel.errors import InvalidRequest
from mlxcel.http.access_log import exchange_note, note_record
from mlxcel.http.body import read_model
from mlxcel.http.files import check_file_urls
from mlxcel.http.guards import current_tenant
from mlxcel.http.handles import Handles, handles, json_response
from mlxcel.http.objects import response_json
from mlxcel.http.params import response_params
from mlxcel.http.rate_limits import metered, rate_limited
from mlxcel.http.schemas import CreateResponseBody, InputTokensBody
from mlxcel.http.streaming import EventStreamBody, bind_to_exchange
from mlxcel.prepare.front import input_token_count, prepare_response
from mlxcel.prepare.intake import check_model
from mlxcel.prepare.limits import check_item_count
from mlxcel.prepare.offload import off_loop
from mlxcel.respond.events import ResponseCreated

responses = Blueprint("responses", __name__)

TRUNCATED_HEADER = "x-truncated-input-items"
"""On a request that sent `truncation`: how many of the oldest rendered input items were
dropped so the prompt fits the context window (0 when none were)."""


@responses.post("/responses")
@rate_limited
async def create_response() -> Response:
    body = await read_model(CreateResponseBody)
    h = handles()
    model = h.served()
    if body.truncation != "auto":  # else the oldest turns are dropped to fit
        check_item_count(body.input, model.info.context_length)  # before any work on it
    check_file_urls(body.input, h.policy.image_placeholders)
    if body.background:
        _check_background(h, body)
    params = await off_loop(response_params, body, tenant=current_tenant())
    prepared = await prepare_response(params, model, policy=h.policy, store=h.store, echo=h.echo)
    generation = await metered(prepared)
    truncated = {TRUNCATED_HEADER: str(generation.truncated_items)} if body.truncation else {}
    if params.background:
        record = await h.jobs.submit(generation)
        note_record(record)
        return _with_headers(json_response(response_json(record)), truncated)
    if not body.stream:
        record = await h.scheduler.generate(generation)
        note_record(record)
        return _with_headers(json_response(response_json(record)), truncated)
    note_record(generation.record)  # its usage once the stream ends
    stream = h.scheduler.stream(generation)
    bind_to_exchange(stream)
    await stream.submit()  # 503 when full
    return Response(
        EventStreamBody(
            ResponseCreated(generation.record),
            stream,
            keepalive_secs=h.keepalive_secs,
            progress=h.progress_events,
            note=exchange_note(),
        ),
        content_type="text/event-stream",
        headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no", **truncated},
    )


def _with_headers(response: Response, headers: dict[str, str]) -> Response:
    response.headers.update(headers)
    return response


@responses.post("/responses/input_tokens")
async def count_input_tokens() -> Response:
    body = await read_model(InputTokensBody)
    h = handles()
    if body.model is not None:
        check_model(h.names, body.model)  # a 404 before the 503 of a model still loading
    model = h.served()
    if body.truncation != "auto":
        check_item_count(body.input, model.info.context_length)
    check_file_urls(body.input, h.policy.image_placeholders)
    params = await off_loop(response_params, body, model=h.names.alias, tenant=current_tenant())
    tokens = await input_token_count(params, model, policy=h.policy, store=h.store, echo=h.echo)
    return json_response({"object": "response.input_tokens", "input_tokens": tokens})


def _check_background(h: Handles, body: CreateResponseBody) -> None:
    if body.stream:
        raise InvalidRequest(
            "'background' cannot be combined with 'stream'.", param="stream", code="invalid_value"
        )
    if not h.background_enabled:
        raise InvalidRequest(
            "Background mode is disabled on this server: it needs the response store and a "
            "job cap above 0 (--responses-store-max-entries, --responses-store-max-bytes, "
            "--responses-background-max-jobs).",
            param="background",
            code="background_disabled",
        )
