"""`POST /v1/responses` and `/v1/responses/input_tokens`: body → prepare → one command.

Synchronous requests wait for the final record; streaming ones are a dumb pipe from the
response stream to SSE frames; background ones answer their `queued` record at once.
"""

from __future__ import annotations

import functools
from collections.abc import AsyncGenerator, AsyncIterable, AsyncIterator
from contextlib import aclosing, asynccontextmanager

from quart import Blueprint, Response

from mlxcel.errors import InvalidRequest
from mlxcel.fleet import ModelLease
from mlxcel.generation import GenerationRequest, ServedModel
from mlxcel.http.access_log import exchange_note, note_record
from mlxcel.http.body import read_model
from mlxcel.http.files import check_file_urls
from mlxcel.http.guards import current_tenant
from mlxcel.http.handles import Handles, handles, json_response
from mlxcel.http.loading import loading_body
from mlxcel.http.objects import response_json
from mlxcel.http.params import response_params
from mlxcel.http.rate_limits import admit, metered, rate_limited
from mlxcel.http.schemas import CreateResponseBody, InputTokensBody
from mlxcel.http.sse import SseEncoder
from mlxcel.http.streaming import EventStreamBody, submit_stream, submitted_stream
from mlxcel.prepare.front import input_token_count, prepare_response
from mlxcel.prepare.limits import check_item_count
from mlxcel.prepare.offload import off_loop
from mlxcel.respond.events import ResponseCreated
from mlxcel.store import StoreHandle

responses = Blueprint("responses", __name__)

TRUNCATED_HEADER = "x-truncated-input-items"
"""On a request that sent `truncation`: how many of the oldest rendered input items were
dropped so the prompt fits the context window (0 when none were)."""


@responses.post("/responses")
@rate_limited
async def create_response() -> Response:
    body = await read_model(CreateResponseBody)
    h = handles()
    key = h.fleet.find(body.model)  # a 404 before any other answer
    check_file_urls(body.input, h.policy.image_placeholders)
    if body.stream and h.fleet.state(key) != "loaded":
        # The stream opens now and has `mlx.progress` events while the model loads.
        return _event_stream(loading_body(key, functools.partial(_streamed, body)))
    async with h.fleet.open_model(body.model) as lease:  # until the work is handed on
        return await _answered(body, lease)


async def _answered(body: CreateResponseBody, lease: ModelLease) -> Response:
    """The answer to `body` on the model `lease` holds: run to its end, queued as a
    background job, or streamed (the job and the stream share the lease)."""
    h = handles()
    generation = await _prepared(body, lease.served())
    truncated = {TRUNCATED_HEADER: str(generation.truncated_items)} if body.truncation else {}
    if generation.record.background:
        record = await h.jobs.submit(generation, lease)
        note_record(record)
        return _with_headers(json_response(response_json(record)), truncated)
    if not body.stream:
        record = await lease.generate(generation)
        note_record(record)
        return _with_headers(json_response(response_json(record)), truncated)
    return _with_headers(_event_stream(await _streamed_body(lease, generation)), truncated)


async def _prepared(
    body: CreateResponseBody, model: ServedModel, store: StoreHandle | None = None
) -> GenerationRequest:
    """`body` prepared for `model`, its tokens reserved on the request's key; `store`:
    where its history is read (the server's store unless given)."""
    h = handles()
    if body.truncation != "auto":  # else the oldest turns are dropped to fit
        check_item_count(body.input, model.info.context_length)  # before any work on it
    if body.background:
        _check_background(h, body)
    params = await off_loop(response_params, body, tenant=current_tenant())
    store = store or h.store
    prepared = await prepare_response(params, model, policy=h.policy, store=store, echo=h.echo)
    return await metered(prepared)


@asynccontextmanager
async def opened_stream(
    body: CreateResponseBody, encoder: SseEncoder, store: StoreHandle
) -> AsyncIterator[EventStreamBody]:
    """`body` served as `POST /responses` serves a stream, for a transport of its own (a
    WebSocket): admitted under the key's limits, its model leased, prepared (history
    read from `store`), metered and submitted; its events encoded by `encoder`. The
    response is cancelled and its lease given back when the block exits."""
    await admit()
    h = handles()
    h.fleet.find(body.model)  # a 404 before any other answer
    check_file_urls(body.input, h.policy.image_placeholders)
    async with h.fleet.open_model(body.model) as lease:
        generation = await _prepared(body, lease.served(), store)
        stream = lease.stream(generation)
        try:
            await submit_stream(stream, generation)
            yield EventStreamBody(
                ResponseCreated(generation.record),
                stream,
                keepalive_secs=h.keepalive_secs,
                progress=h.progress_events,
                note=exchange_note(),
                encoder=encoder,
            )
        finally:
            await stream.aclose()  # shielded inside; idempotent


async def _streamed(
    body: CreateResponseBody, lease: ModelLease, encoder: SseEncoder
) -> AsyncGenerator[bytes]:
    """The frames of a streamed response once its model is loaded (`loading_body`)."""
    generation = await _prepared(body, lease.served())
    streamed = await _streamed_body(lease, generation, encoder)
    async with aclosing(streamed):
        async for frame in streamed:
            yield frame


async def _streamed_body(
    lease: ModelLease, generation: GenerationRequest, encoder: SseEncoder | None = None
) -> EventStreamBody:
    """The response submitted (503 when full) and its stream bound to the exchange."""
    h = handles()
    return EventStreamBody(
        ResponseCreated(generation.record),
        await submitted_stream(lease, generation),
        keepalive_secs=h.keepalive_secs,
        progress=h.progress_events,
        note=exchange_note(),
        encoder=encoder,
    )


def _event_stream(body: AsyncIterable[bytes]) -> Response:
    return Response(
        body,
        content_type="text/event-stream",
        headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
    )


def _with_headers(response: Response, headers: dict[str, str]) -> Response:
    response.headers.update(headers)
    return response


@responses.post("/responses/input_tokens")
@rate_limited  # a request against the key's rate (it renders a whole input), no tokens
async def count_input_tokens() -> Response:
    body = await read_model(InputTokensBody)
    h = handles()
    async with h.fleet.open_model(body.model) as lease:  # a 404 before any other answer
        return await _counted(body, lease.served())


async def _counted(body: InputTokensBody, model: ServedModel) -> Response:
    """The input tokens `body` would take on `model`."""
    h = handles()
    if body.truncation != "auto":
        check_item_count(body.input, model.info.context_length)
    check_file_urls(body.input, h.policy.image_placeholders)
    alias = model.names.alias
    params = await off_loop(response_params, body, model=alias, tenant=current_tenant())
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
