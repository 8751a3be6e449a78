"""The HTTP actor's routes: a thin layer from requests to actor commands and back.

Synchronous requests wait for the final record; streaming ones are a dumb pipe from the
reply channel to SSE frames. Every route is mounted with and without `/v1`.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import trio
from quart import Response, request
from quart_trio import QuartTrio

from mlxcel.actors.echo import EchoHandle
from mlxcel.actors.jobs import JobsHandle
from mlxcel.actors.messages import ResponseCreated, Table
from mlxcel.actors.scheduler import SchedulerHandle
from mlxcel.actors.store import StoreHandle
from mlxcel.errors import ContextLengthExceeded, InvalidRequest, ModelNotFound, NotFound
from mlxcel.generation import CompactionReport, GenerationRequest, ModelView
from mlxcel.http.body import MAX_BODY_BYTES, read_model
from mlxcel.http.conversations import register_conversations
from mlxcel.http.errors import error_body, map_error
from mlxcel.http.exchange import App
from mlxcel.http.guards import check_api_key, check_json_body, check_not_stopping
from mlxcel.http.objects import item_json, response_json, usage_json
from mlxcel.http.openapi import register_openapi
from mlxcel.http.params import response_params
from mlxcel.http.schemas import (
    MAX_COMPACT_THRESHOLD,
    CompactBody,
    CreateResponseBody,
    InputTokensBody,
    list_page,
    to_items,
)
from mlxcel.http.streaming import EventStreamBody, bind_to_exchange
from mlxcel.items import Item, ResponseRecord, new_id
from mlxcel.prepare.compaction import (
    DEFAULT_SUMMARY_TOKENS,
    Compactor,
    check_reduction,
    default_keep_tokens,
    rendered_tokens,
)
from mlxcel.prepare.intake import (
    ModelNames,
    build_request,
    input_items,
    intake_items,
    read_history,
    render,
)
from mlxcel.prepare.limits import check_item_count
from mlxcel.prepare.offload import off_loop
from mlxcel.prepare.params import ResponseParams


@dataclass(frozen=True, slots=True)
class Handles:
    """What the routes talk to."""

    model: ModelView
    scheduler: SchedulerHandle
    store: StoreHandle
    jobs: JobsHandle
    echo: EchoHandle
    names: ModelNames
    background_enabled: bool = True
    api_keys: tuple[str, ...] = ()
    stopping: trio.Event = dataclasses.field(default_factory=trio.Event)
    """Set on shutdown: no new generation starts."""


def json_response(body: Any, status: int = 200) -> Response:
    # Strict JSON out, as in: a NaN would break every strict parser (a ValueError here is
    # a bug, answered as a 500 and logged).
    data = json.dumps(body, allow_nan=False)
    return Response(data, status=status, content_type="application/json")


def create_app(handles: Handles, *, body_timeout_secs: float = 60.0) -> QuartTrio:
    app = App("mlxcel", static_folder=None)  # no static files: only the API's routes
    # Generation can take minutes; streams end when generation ends, not on a timer.
    app.config["RESPONSE_TIMEOUT"] = None
    app.config["BODY_TIMEOUT"] = body_timeout_secs
    app.config["MAX_CONTENT_LENGTH"] = MAX_BODY_BYTES
    started = int(time.time())

    def route(rule: str, **options: Any) -> Callable[[Any], Any]:
        def register(view: Any) -> Any:
            app.add_url_rule(rule, endpoint=view.__name__, view_func=view, **options)
            app.add_url_rule(
                f"/v1{rule}", endpoint=f"v1_{view.__name__}", view_func=view, **options
            )
            return view

        return register

    @app.errorhandler(Exception)
    async def handle_error(exc: Exception) -> Response:
        status, body = map_error(exc)
        response = json_response(body, status)
        if status in (429, 503):
            response.headers["Retry-After"] = "1"
        return response

    @app.before_request
    async def guard() -> None:
        check_api_key(handles.api_keys)
        check_json_body()
        check_not_stopping(handles.stopping)

    @app.get("/health")
    async def health() -> Response:
        if handles.stopping.is_set():
            body = error_body("The server is shutting down.", "server_error", code="stopping")
            return json_response(body, 503)
        if not handles.model.ready.is_set():
            body = error_body("The model is still loading.", "server_error", code="loading")
            return json_response(body, 503)
        slots = await handles.scheduler.statistics()
        return json_response(
            {
                "status": "ok",
                "slots": {"total": slots.slots, "busy": slots.busy, "queued": slots.queued},
            }
        )

    @route("/models", methods=["GET"])
    async def models() -> Response:
        entry = {
            "id": handles.names.alias,
            "object": "model",
            "created": started,
            "owned_by": "mlxcel",
        }
        return json_response({"object": "list", "data": [entry]})

    @route("/responses", methods=["POST"])
    async def create_response() -> Response:
        body = await read_model(CreateResponseBody)
        info, codec = handles.model.info, handles.model.codec
        check_item_count(body.input, info.context_length)
        if body.background:
            _check_background(handles, body)
        params = await off_loop(response_params, body)
        history = await read_history(params, handles.store)
        alias, context_length = handles.names.alias, info.context_length
        items = await intake_items(params, history, context_length, alias, handles.echo)
        compacts = params.compact_threshold is not None
        if compacts and not params.background:
            generation = await _prepare(handles, params, history, items)
        else:  # a background job compacts when its turn comes
            generation = await off_loop(
                functools.partial(build_request, fits=not compacts),
                params,
                handles.names,
                info,
                codec,
                history,
                items,
            )
        if params.background:
            prepare = functools.partial(_prepare, handles, params, history, items, waits=True)
            queued = await handles.jobs.submit(generation, prepare if compacts else None)
            return json_response(response_json(queued))
        if not body.stream:
            return json_response(response_json(await handles.scheduler.generate(generation)))
        stream = handles.scheduler.stream(generation)
        bind_to_exchange(stream)
        await stream.submit()  # 503 when full
        return Response(
            EventStreamBody(ResponseCreated(generation.record), stream),
            content_type="text/event-stream",
            headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
        )

    @route("/responses/input_tokens", methods=["POST"])
    async def count_input_tokens() -> Response:
        body = await read_model(InputTokensBody)
        if body.model is not None and not handles.names.matches(body.model):
            raise ModelNotFound(body.model, [handles.names.alias])
        info, codec = handles.model.info, handles.model.codec
        check_item_count(body.input, info.context_length)
        params = await off_loop(response_params, body, model=handles.names.alias)
        history = await read_history(params, handles.store)
        alias, context_length = handles.names.alias, info.context_length
        items = await intake_items(params, history, context_length, alias, handles.echo)
        _, prompt = await off_loop(render, params, history, codec, items)
        return json_response({"object": "response.input_tokens", "input_tokens": len(prompt)})

    @route("/responses/compact", methods=["POST"])
    async def compact_history() -> Response:
        body = await read_model(CompactBody)
        if not handles.names.matches(body.model):
            raise ModelNotFound(body.model, [handles.names.alias])
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
        info, codec = handles.model.info, handles.model.codec
        check_item_count(body.input, info.context_length)
        if body.keep_tokens is not None and body.keep_tokens >= info.context_length:
            raise InvalidRequest(
                f"'keep_tokens' must be below the {info.context_length}-token context window: "
                "the preserved turns and the summary must fit it together.",
                param="keep_tokens",
                code="invalid_value",
            )
        history = await read_history(body, handles.store)
        raw = await off_loop(to_items, body.input)
        items = history + await off_loop(
            input_items, raw, body.instructions, None, history, info.context_length
        )
        before = await off_loop(rendered_tokens, codec, items)
        if before > info.context_length:
            raise ContextLengthExceeded(
                f"The history is {before} tokens, longer than the {info.context_length}-token "
                "context window, so it cannot be summarised in one pass."
            )
        compactor = Compactor(handles.scheduler, codec, info, handles.names.alias)
        compacted = await compactor.compact(
            items,
            instructions=body.instructions,
            keep_tokens=body.keep_tokens,
            max_output_tokens=body.max_output_tokens,
        )
        output: tuple[Item, ...] = (*compacted.kept, *compacted.item.preserved, compacted.item)
        after = await off_loop(rendered_tokens, codec, output)
        check_reduction(before, after, info.context_length)
        return json_response(
            {
                "id": new_id("resp"),
                "object": "response.compaction",
                "created_at": int(time.time()),
                "model": body.model,
                "output": [item_json(i) for i in output],
                "usage": usage_json(compacted.usage),
            }
        )

    @route("/responses/<response_id>", methods=["GET"])
    async def retrieve_response(response_id: str) -> Response:
        return json_response(response_json(await _stored(handles, response_id)))

    @route("/responses/<response_id>", methods=["DELETE"])
    async def delete_response(response_id: str) -> Response:
        record = await _stored(handles, response_id)
        if record.status in ("queued", "in_progress"):
            raise InvalidRequest(
                f"Response '{response_id}' has not finished (status: {record.status}); "
                "cancel it first.",
                param="response_id",
                code="response_not_finished",
            )
        await handles.store.delete(response_id, Table.RESPONSES)
        await handles.store.delete(response_id, Table.EPHEMERAL)
        return json_response({"id": response_id, "object": "response.deleted", "deleted": True})

    @route("/responses/<response_id>/cancel", methods=["POST"])
    async def cancel_response(response_id: str) -> Response:
        _check_response_id(handles, response_id)
        record = await handles.jobs.cancel(response_id)
        if record is None:
            record = await handles.scheduler.cancel(response_id)
        if record is None:
            record = await _stored(handles, response_id)
        return json_response(response_json(record))

    @route("/responses/<response_id>/input_items", methods=["GET"])
    async def list_input_items(response_id: str) -> Response:
        record = await _stored(handles, response_id)
        page = list_page([item_json(i) for i in record.input_items], request.args)
        return json_response(page)

    register_conversations(route, handles.store, json_response)
    register_openapi(route, app, json_response)
    return app


async def _prepare(
    handles: Handles,
    params: ResponseParams,
    history: tuple[Item, ...],
    items: tuple[Item, ...],
    *,
    waits: bool = False,
) -> GenerationRequest:
    """The request under `context_management`: compacted first when its rendered input
    reaches the threshold or leaves no room for output."""
    info, codec = handles.model.info, handles.model.codec
    build = functools.partial(build_request, params, handles.names, info, codec, history, items)
    generation = await off_loop(build, fits=False)
    before = len(generation.prompt)
    threshold = params.compact_threshold or MAX_COMPACT_THRESHOLD
    if before < threshold and before < info.context_length:
        return generation
    compactor = Compactor(handles.scheduler, codec, info, handles.names.alias)
    # Preserved turns get at most half the threshold and the summary a quarter, so the
    # compacted prompt starts well below it.
    keep = min(default_keep_tokens(info.context_length), max(1, threshold // 2))
    summary = min(DEFAULT_SUMMARY_TOKENS, max(16, threshold // 4))
    compacted = await compactor.compact(
        history + items, keep_tokens=keep, max_output_tokens=summary, waits=waits
    )
    generation = await off_loop(build, compacted.item)
    check_reduction(before, len(generation.prompt), info.context_length)
    report = CompactionReport(compacted.item, before, len(generation.prompt))
    return dataclasses.replace(generation, compaction=report)


def _check_background(handles: Handles, body: CreateResponseBody) -> None:
    if body.stream:
        raise InvalidRequest(
            "'background' cannot be combined with 'stream'.", param="stream", code="invalid_value"
        )
    if not handles.background_enabled:
        raise InvalidRequest(
            "Background mode is disabled on this server: it needs the response store and a "
            "job cap above 0 (--responses-store-max-entries, --responses-store-max-bytes, "
            "--responses-background-max-jobs).",
            param="background",
            code="background_disabled",
        )


def _check_response_id(handles: Handles, response_id: str) -> None:
    if not handles.store.responses_limits.enabled:
        raise InvalidRequest(
            "Response storage is disabled on this server (--responses-store-max-entries 0).",
            code="storage_disabled",
        )
    if not response_id.startswith("resp_"):
        raise InvalidRequest(
            f"Invalid 'response_id': {response_id[:64]!r}. Expected an id that begins with "
            "'resp_'.",
            param="response_id",
            code="invalid_value",
        )


async def _stored(handles: Handles, response_id: str) -> ResponseRecord:
    _check_response_id(handles, response_id)
    record = await handles.store.get(response_id)
    if record is None:
        raise NotFound(f"Response with id '{response_id}' not found.", code="not_found")
    return record
