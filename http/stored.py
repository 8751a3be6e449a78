"""Stored responses: retrieve, delete, cancel and list input items."""

from __future__ import annotations

from quart import Blueprint, Response, request

from mlxcel.errors import InvalidRequest, NotFound
from mlxcel.http.access_log import exchange_note
from mlxcel.http.guards import current_tenant
from mlxcel.http.handles import Handles, handles, json_response
from mlxcel.http.objects import item_json, response_json
from mlxcel.http.resume import resume, wants_stream
from mlxcel.http.schemas import list_page
from mlxcel.items import ResponseRecord
from mlxcel.prepare.offload import off_loop

stored = Blueprint("stored", __name__)


@stored.get("/responses/<response_id>")
async def retrieve_response(response_id: str) -> Response:
    stream = wants_stream()
    record = await _stored(handles(), response_id)
    if stream:
        return await resume(handles(), record)
    if len(record.input_items) + len(record.output) < OFF_LOOP_ITEMS:
        return json_response(response_json(record))
    return await off_loop(lambda: json_response(response_json(record)))  # a big record


OFF_LOOP_ITEMS = 1_000
"""A record with this many items or more is written as JSON in a worker thread."""


@stored.delete("/responses/<response_id>")
async def delete_response(response_id: str) -> Response:
    h = handles()
    record = await _stored(h, response_id)
    if record.status in ("queued", "in_progress"):
        raise InvalidRequest(
            f"Response '{response_id}' has not finished (status: {record.status}); "
            "cancel it first.",
            param="response_id",
            code="response_not_finished",
        )
    await h.store.delete_response(response_id)  # its event log too: it holds its text
    return json_response({"id": response_id, "object": "response.deleted", "deleted": True})


@stored.post("/responses/<response_id>/cancel")
async def cancel_response(response_id: str) -> Response:
    h = handles()
    _check_response_id(h, response_id)
    tenant = current_tenant()
    record = await h.jobs.cancel(response_id, tenant=tenant)
    if record is None:
        record = await h.scheduler.cancel(response_id, tenant=tenant)
    if record is None:
        record = await _stored(h, response_id)
        if record.status in ("queued", "in_progress"):
            # Another replica runs it: ask its owner, and answer with the end it stores.
            record = await h.store.cancel_elsewhere(response_id) or record
    exchange_note().response(record.id)
    return json_response(response_json(record))


@stored.get("/responses/<response_id>/input_items")
async def list_input_items(response_id: str) -> Response:
    record = await _stored(handles(), response_id)
    page = list_page(record.input_items, request.args, item_json)
    return json_response(page)


def _check_response_id(h: Handles, response_id: str) -> None:
    if not h.store.responses_limits.enabled:
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


async def _stored(h: Handles, response_id: str) -> ResponseRecord:
    """The request's tenant's response; another tenant's is not found, as a missing one."""
    _check_response_id(h, response_id)
    record = await h.store.get(response_id, tenant=current_tenant())
    if record is None:
        raise NotFound(f"Response with id '{response_id}' not found.", code="not_found")
    exchange_note().response(record.id)
    return record
