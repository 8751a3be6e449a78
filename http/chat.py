"""`POST /v1/chat/completions` and `/v1/completions`: the Responses pipeline under
OpenAI's older wire formats.

A body becomes `ResponseParams` (no storage), is prepared exactly as a response is, and
runs as one response on the scheduler; its record or its events are translated into
chat completions, chunks or text completions at the edge.
"""

from __future__ import annotations

import dataclasses

from quart import Blueprint, Response

from mlxcel.errors import InvalidRequest
from mlxcel.generation import GenerationRequest, ServedModel
from mlxcel.http.access_log import note_record
from mlxcel.http.body import read_model
from mlxcel.http.chat_objects import (
    ChatChunks,
    TextChunks,
    chat_completion,
    finished,
    text_completion,
)
from mlxcel.http.chat_schemas import (
    ChatCompletionBody,
    CompletionBody,
    chat_params,
    completion_params,
)
from mlxcel.http.guards import current_tenant
from mlxcel.http.handles import Handles, handles, json_response, served
from mlxcel.http.rate_limits import metered, rate_limited
from mlxcel.http.streaming import translated_response
from mlxcel.prepare.front import prepare_chat
from mlxcel.prepare.limits import check_item_count
from mlxcel.prepare.offload import off_loop
from mlxcel.prepare.params import ResponseParams

chat = Blueprint("chat", __name__)


@chat.post("/chat/completions")
@rate_limited
async def create_chat_completion() -> Response:
    body = await read_model(ChatCompletionBody)
    h = handles()
    model = await served(body.model)
    check_item_count(body.messages, model.info.context_length)
    params = await off_loop(chat_params, body)
    generation = await _prepare(h, model, params)
    logprobs = bool(body.logprobs)
    if not body.stream:
        record = finished(await h.scheduler.generate(generation))
        note_record(record)
        return json_response(chat_completion(record, logprobs=logprobs))
    chunks = ChatChunks(generation.record, body.include_usage, logprobs)
    return await translated_response(h, generation, [chunks.first()], chunks.translate)


@chat.post("/completions")
@rate_limited
async def create_completion() -> Response:
    body = await read_model(CompletionBody)
    h = handles()
    params = completion_params(body)  # its 400s before the 503 of a model still loading
    generation = await _prepare(h, await served(body.model), params)
    prefix = body.text if body.echo else ""
    logprobs = body.logprobs is not None
    if not body.stream:
        record = finished(await h.scheduler.generate(generation))
        note_record(record)
        return json_response(text_completion(record, prefix=prefix, logprobs=logprobs))
    chunks = TextChunks(generation.record, body.include_usage, logprobs, prefix)
    first = chunks.first()
    return await translated_response(h, generation, [first] if first else [], chunks.translate)


async def _prepare(h: Handles, model: ServedModel, params: ResponseParams) -> GenerationRequest:
    """The request prepared for its tenant, as `/responses` prepares one that names no
    history; a 400 names the field as this wire format does."""
    params = dataclasses.replace(params, tenant=current_tenant())
    try:
        return await metered(await prepare_chat(params, model, policy=h.policy, echo=h.echo))
    except InvalidRequest as exc:  # named as this wire format names the field
        if exc.param is not None and exc.param.startswith("text.format"):
            exc.param = "response_format" + exc.param.removeprefix("text.format")
        raise
