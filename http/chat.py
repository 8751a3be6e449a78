"""`POST /v1/chat/completions` and `/v1/completions`: the Responses pipeline under
OpenAI's older wire formats.

A body becomes `ResponseParams` (no storage), is prepared exactly as a response is, and
runs as one response on the scheduler (one for each of its `n` choices: `http/choices.py`);
its record or its events are translated into chat completions, chunks or text
completions at the edge.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

from quart import Blueprint, Response

from mlxcel.errors import InvalidRequest
from mlxcel.fleet import ModelLease
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
from mlxcel.http.chat_params import chat_params, completion_params
from mlxcel.http.chat_sampling import check_n
from mlxcel.http.chat_schemas import ChatCompletionBody, CompletionBody
from mlxcel.http.choices import (
    ChoiceChunks,
    ChoiceEvents,
    fan_out,
    metered_all,
    run_all,
    submit_all,
    with_summed_usage,
)
from mlxcel.http.guards import current_tenant
from mlxcel.http.handles import Handles, handles, json_response
from mlxcel.http.rate_limits import rate_limited
from mlxcel.http.streaming import data_stream_response, translated_response
from mlxcel.items import ResponseRecord
from mlxcel.prepare.front import prepare_chat
from mlxcel.prepare.limits import check_item_count
from mlxcel.prepare.offload import off_loop
from mlxcel.prepare.params import ResponseParams

chat = Blueprint("chat", __name__)


@chat.post("/chat/completions")
@rate_limited
async def create_chat_completion() -> Response:
    body = await read_model(ChatCompletionBody)
    async with handles().fleet.open_model(body.model) as lease:  # until the work is handed on
        return await _chat_completion(body, lease)


async def _chat_completion(body: ChatCompletionBody, lease: ModelLease) -> Response:
    h = handles()
    model = lease.served()
    check_item_count(body.messages, model.info.context_length)
    params = await off_loop(chat_params, body)
    generations = await _prepare(h, model, params, check_n(body.n))
    logprobs = bool(body.logprobs)
    if not body.stream:
        records = await _run(lease, generations)
        return json_response(chat_completion(records, logprobs=logprobs))
    chunks = [
        ChatChunks(generations[0].record, body.include_usage, logprobs, i, len(generations) == 1)
        for i in range(len(generations))
    ]
    first = [c.first() for c in chunks]
    return await _stream(h, lease, generations, first, chunks, body.include_usage)


@chat.post("/completions")
@rate_limited
async def create_completion() -> Response:
    body = await read_model(CompletionBody)
    params = completion_params(body)  # its 400s before the 503 of a model still loading
    async with handles().fleet.open_model(body.model) as lease:  # until the work is handed on
        return await _completion(body, params, lease)


async def _completion(body: CompletionBody, params: ResponseParams, lease: ModelLease) -> Response:
    h = handles()
    generations = await _prepare(h, lease.served(), params, check_n(body.n))
    prefix = body.text if body.echo else ""
    logprobs = body.logprobs is not None
    if not body.stream:
        records = await _run(lease, generations)
        return json_response(text_completion(records, prefix=prefix, logprobs=logprobs))
    chunks = [
        TextChunks(
            generations[0].record, body.include_usage, logprobs, prefix, i, len(generations) == 1
        )
        for i in range(len(generations))
    ]
    first = [f for c in chunks if (f := c.first()) is not None]
    return await _stream(h, lease, generations, first, chunks, body.include_usage)


async def _prepare(
    h: Handles, model: ServedModel, params: ResponseParams, n: int
) -> list[GenerationRequest]:
    """The request prepared for its tenant, as `/responses` prepares one that names no
    history, once for each of its `n` choices; a 400 names the field as this wire
    format does."""
    params = dataclasses.replace(params, tenant=current_tenant())
    try:
        prepared = await prepare_chat(params, model, policy=h.policy, echo=h.echo)
    except InvalidRequest as exc:  # named as this wire format names the field
        if exc.param is not None and exc.param.startswith("text.format"):
            exc.param = "response_format" + exc.param.removeprefix("text.format")
        raise
    return await metered_all(fan_out(prepared, n))


async def _run(lease: ModelLease, generations: list[GenerationRequest]) -> list[ResponseRecord]:
    """Every choice's final record (a 500 when one failed)."""
    if len(generations) == 1:
        records = [await lease.generate(generations[0])]
    else:
        records = await run_all(lease, generations)
    note_record(with_summed_usage(records))
    return [finished(record) for record in records]


async def _stream(
    h: Handles,
    lease: ModelLease,
    generations: list[GenerationRequest],
    first: list[dict[str, Any]],
    chunks: Sequence[ChatChunks] | Sequence[TextChunks],
    include_usage: bool,
) -> Response:
    """The choices' chunks as one stream (one choice: as every response streams); every
    chunk carries the first choice's id."""
    if len(generations) == 1:
        return await translated_response(h, lease, generations[0], first, chunks[0].translate)
    note_record(generations[0].record)
    events = ChoiceEvents(await submit_all(lease, generations, bind=True))
    events.start()
    translate = ChoiceChunks(chunks, generations, include_usage=include_usage).translate
    return data_stream_response(h, events, first, translate)
