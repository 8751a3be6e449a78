"""The server's own routes: health, the root, the model list and the OpenAPI document.

The model routes answer in OpenAI's shape, or in Anthropic's when the request carries
`anthropic-version` (`speaks_anthropic`); the root answers 200, as clients probing the
server (Claude Code's `HEAD /`) expect."""

from __future__ import annotations

from typing import Any

from quart import Blueprint, Response, current_app

from mlxcel import __version__
from mlxcel.http.errors import error_body
from mlxcel.http.handles import handles, json_response
from mlxcel.http.messages import speaks_anthropic
from mlxcel.http.messages_objects import model_json, model_list_json
from mlxcel.http.openapi import openapi_document_for
from mlxcel.prepare.intake import check_model

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


@health_routes.get("/")
async def root() -> Response:
    return json_response({"name": "mlxcel", "version": __version__})


@service.get("/models")
async def models() -> Response:
    h = handles()
    entry = _model(h.names.alias)
    if speaks_anthropic():
        return json_response(model_list_json([entry]))
    return json_response({"object": "list", "data": [entry]})


@service.get("/models/<path:model_id>")
async def retrieve_model(model_id: str) -> Response:
    """The loaded model under a name it answers to (as asked); 404 for any other."""
    check_model(handles().names, model_id)
    return json_response(_model(model_id))


def _model(model_id: str) -> dict[str, Any]:
    h = handles()
    if speaks_anthropic():
        context_length = h.model.info.context_length if h.model.ready.is_set() else None
        return model_json(model_id, h.started, context_length)
    return {"id": model_id, "object": "model", "created": h.started, "owned_by": "mlxcel"}


_DOCUMENT = "openapi_document"


@service.get("/openapi.json")
async def openapi_document() -> Response:
    """Built on first request, once every route is mounted, then kept."""
    document: dict[str, Any] | None = current_app.extensions.get(_DOCUMENT)
    if document is None:
        document = current_app.extensions[_DOCUMENT] = openapi_document_for(current_app)
    return json_response(document)
