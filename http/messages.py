"""`POST /v1/messages` and `/v1/messages/count_tokens`: Anthropic's Messages API on the
Responses pipeline.

A body becomes `ResponseParams` (no storage; `http/messages_params.py`), is prepared
exactly as a chat completion is, and runs as one response on the scheduler; its record
or its events become Anthropic's message or stream events at the edge. A query string
(Claude Code's `?beta=true`) and the `anthropic-version` and `anthropic-beta` headers
are accepted; betas this server does not know change nothing.

Which requests speak Anthropic's wire (`speaks_anthropic`): these routes always, and the
model list and the root when the request carries `anthropic-version`. Their errors are
Anthropic's (`http/errors.py`), and every answer carries a `request-id` header, which an
error body repeats.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import cast

from quart import Blueprint, Response, request

from mlxcel.errors import InvalidRequest
from mlxcel.fleet import ModelLease
from mlxcel.generation import GenerationRequest, ServedModel
from mlxcel.http.access_log import note_record
from mlxcel.http.body import read_model
from mlxcel.http.chat_objects import finished
from mlxcel.http.guards import current_tenant
from mlxcel.http.handles import handles, json_response
from mlxcel.http.messages_objects import Thinking, message_json
from mlxcel.http.messages_params import message_params
from mlxcel.http.messages_schemas import CountTokensBody, MessagesBody
from mlxcel.http.messages_stream import MESSAGE_FRAMES, MessageEvents
from mlxcel.http.rate_limits import metered, rate_limited
from mlxcel.http.streaming import translated_response
from mlxcel.items import new_id
from mlxcel.prepare.front import input_token_count, prepare_chat
from mlxcel.prepare.limits import check_item_count
from mlxcel.prepare.offload import off_loop
from mlxcel.store.echo import trace_signature

messages = Blueprint("messages", __name__)

REQUEST_ID_KEY = "mlxcel.request_id"
"""Where a request's scope keeps its `request-id`."""
VERSION_HEADER = "anthropic-version"


def speaks_anthropic() -> bool:
    """Whether the request being served is answered in Anthropic's wire format."""
    path = request.path.removeprefix("/v1")
    if path == "/messages" or path.startswith("/messages/"):
        return True
    answers_both = path in ("", "/", "/models") or path.startswith("/models/")
    return answers_both and VERSION_HEADER in request.headers


def request_id() -> str:
    """The id of the request being served (`req_…`), made on first use."""
    scope = cast(dict[str, object], request.scope)
    found = scope.get(REQUEST_ID_KEY)
    if not isinstance(found, str):
        found = scope[REQUEST_ID_KEY] = new_id("req")
    return found


async def add_request_id(response: Response) -> Response:
    """A `request-id` on every answer in Anthropic's wire format (errors too)."""
    if speaks_anthropic():
        response.headers["request-id"] = request_id()
    return response


@messages.post("/messages")
@rate_limited
async def create_message() -> Response:
    body = await read_model(MessagesBody)
    async with handles().fleet.open_model(body.model) as lease:  # until the work is handed on
        return await _message(body, lease)


async def _message(body: MessagesBody, lease: ModelLease) -> Response:
    generation = await _prepare(body, lease.served())
    thinking = Thinking(_signer(generation), shown=_shown(body))
    marked = body.marks_cache()
    h = handles()
    if not body.stream:
        record = finished(await lease.generate(generation))
        note_record(record)
        return json_response(message_json(record, thinking, marked=marked))
    events = MessageEvents(generation.record, thinking, marked)
    return await translated_response(h, lease, generation, [], events.translate, MESSAGE_FRAMES)


@messages.post("/messages/count_tokens")
@rate_limited  # a request against the key's rate, but no tokens charged
async def count_message_tokens() -> Response:
    body = await read_model(CountTokensBody)
    h = handles()
    async with h.fleet.open_model(body.model) as lease:  # a 404 before any other answer
        model = lease.served()
        check_item_count(body.messages, model.info.context_length)
        params = await off_loop(message_params, body)
        params = dataclasses.replace(params, tenant=current_tenant())
        tokens = await input_token_count(params, model, policy=h.policy, store=h.store, echo=h.echo)
    return json_response({"input_tokens": tokens})


async def _prepare(body: MessagesBody, model: ServedModel) -> GenerationRequest:
    """The request prepared for its tenant, as a chat completion is; its traces signed."""
    h = handles()
    check_item_count(body.messages, model.info.context_length)
    params = await off_loop(message_params, body)
    params = dataclasses.replace(params, tenant=current_tenant())
    try:
        prepared = await prepare_chat(params, model, policy=h.policy, echo=h.echo)
    except InvalidRequest as exc:  # named as this wire format names the field
        found = body.output_schema()
        if found is not None and exc.param is not None and exc.param.startswith("text.format"):
            exc.param = found[0] + exc.param.removeprefix("text.format")
            exc.message = f"Invalid '{exc.param}': {exc.message}"  # Anthropic's body has no param
        raise
    return await metered(dataclasses.replace(prepared, signs_reasoning=True))


def _signer(generation: GenerationRequest) -> Callable[[str], str]:
    prefix = generation.echo_prefix or ""
    return lambda trace: trace_signature(prefix, trace)


def _shown(body: MessagesBody) -> bool:
    return body.thinking is None or body.thinking.display != "omitted"
