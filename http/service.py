"""The server's own routes: health, the model list and the OpenAPI document."""

from __future__ import annotations

from typing import Any

from quart import Blueprint, Response, current_app

from mlxcel.http.errors import error_body
from mlxcel.http.handles import handles, json_response
from mlxcel.http.openapi import openapi_document_for

health_routes = Blueprint("health", __name__)
"""Mounted once, without `/v1`, and open without an API key."""
service = Blueprint("service", __name__)


@health_routes.get("/health")
async def health() -> Response:
    h = handles()
    if h.stopping.is_set():
        body = error_body("The server is shutting down.", "server_error", code="stopping")
        return json_response(body, 503)
    if not h.model.ready.is_set():
        body = error_body("The model is still loading.", "server_error", code="loading")
        return json_response(body, 503)
    slots = await h.scheduler.statistics()
    return json_response(
        {
            "status": "ok",
            "slots": {"total": slots.slots, "busy": slots.busy, "queued": slots.queued},
        }
    )


@service.get("/models")
async def models() -> Response:
    h = handles()
    entry = {"id": h.names.alias, "object": "model", "created": h.started, "owned_by": "mlxcel"}
    return json_response({"object": "list", "data": [entry]})


_DOCUMENT = "openapi_document"


@service.get("/openapi.json")
async def openapi_document() -> Response:
    """Built on first request, once every route is mounted, then kept."""
    document: dict[str, Any] | None = current_app.extensions.get(_DOCUMENT)
    if document is None:
        document = current_app.extensions[_DOCUMENT] = openapi_document_for(current_app)
    return json_response(document)
