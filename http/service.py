"""The server's own routes: health, the root, the model list, loading and unloading a
model (an admin key's, `http/admin.py`) and the OpenAPI document.

The model routes answer in OpenAI's shape, or in Anthropic's when the request carries
`anthropic-version` (`speaks_anthropic`); the root answers 200, as clients probing the
server (Claude Code's `HEAD /`) expect."""

from __future__ import annotations

from typing import Any

from quart import Blueprint, Response, current_app

from mlxcel import __version__
from mlxcel.http.admin import admin_only, note_admin_call
from mlxcel.http.body import read_model
from mlxcel.http.errors import error_body
from mlxcel.http.handles import handles, json_response
from mlxcel.http.messages import speaks_anthropic
from mlxcel.http.messages_objects import model_json, model_list_json
from mlxcel.http.openapi import openapi_document_for
from mlxcel.http.schemas import ModelAction

health_routes = Blueprint("health", __name__)
"""Mounted once, without `/v1`, and open without an API key."""
service = Blueprint("service", __name__)


@health_routes.get("/health")
async def health() -> Response:
    """200 while any model can serve (one is loaded, or one can be loaded on demand),
    with each model's state."""
    h = handles()
    if h.stopping.is_set():
        body = error_body("The server is shutting down.", "server_error", code="stopping")
        return json_response(body, 503)
    if not h.fleet.can_serve():
        body = error_body("The model is still loading.", "server_error", code="loading")
        body["models"] = _states()
        return json_response(body, 503)
    slots = await h.scheduler.statistics()
    return json_response(
        {
            "status": "ok",
            "slots": {"total": slots.slots, "busy": slots.busy, "queued": slots.queued},
            "models": _states(),
        }
    )


def _states() -> dict[str, str]:
    return {name: state for name, state, _ in handles().fleet.models()}


@health_routes.get("/")
async def root() -> Response:
    return json_response({"name": "mlxcel", "version": __version__})


@service.get("/models")
async def models() -> Response:
    """Every configured model, with its state (`loaded`, `loading`, `unloading`,
    `unloaded`) in OpenAI's shape."""
    entries = [_model(name) for name, _, _ in handles().fleet.models()]
    if speaks_anthropic():
        return json_response(model_list_json(entries))
    return json_response({"object": "list", "data": entries})


@service.get("/models/<path:model_id>")
async def retrieve_model(model_id: str) -> Response:
    """A configured model under a name it answers to (as asked); 404 for any other."""
    handles().fleet.find(model_id)
    return json_response(_model(model_id))


@service.post("/models/<path:model_id>/load")
@admin_only("load")
async def load_model(model_id: str) -> Response:
    """Load a configured model now (evicting another at the limit); answers once loaded."""
    return json_response(await _load(model_id))


@service.post("/models/<path:model_id>/unload")
@admin_only("unload")
async def unload_model(model_id: str) -> Response:
    """Unload a model once its work has drained; 409 for a pinned one."""
    return json_response(await _unload(model_id))


@service.post("/models/load")
@admin_only("load")
async def load_named_model() -> Response:
    """llama.cpp's router form: `{"model": id}`."""
    body = await read_model(ModelAction)
    return json_response({**await _load(body.model), "success": True})


@service.post("/models/unload")
@admin_only("unload")
async def unload_named_model() -> Response:
    """llama.cpp's router form: `{"model": id}`."""
    body = await read_model(ModelAction)
    return json_response({**await _unload(body.model), "success": True})


async def _load(model_id: str) -> dict[str, Any]:
    fleet = handles().fleet
    note_admin_call("load", model_id)
    await fleet.load(fleet.find(model_id))
    return _model(model_id)


async def _unload(model_id: str) -> dict[str, Any]:
    fleet = handles().fleet
    note_admin_call("unload", model_id)
    await fleet.unload(fleet.find(model_id))
    return _model(model_id)


def _model(model_id: str) -> dict[str, Any]:
    """The `model` object of `model_id` (a name of a configured model)."""
    h = handles()
    key = h.fleet.find(model_id)
    if speaks_anthropic():
        found = [e for e in h.fleet.loaded() if e.names.alias == key]
        context_length = found[0].model.info.context_length if found else None
        return model_json(model_id, h.started, context_length)
    entry: dict[str, Any] = {
        "id": model_id,
        "object": "model",
        "created": h.started,
        "owned_by": "mlxcel",
        "state": h.fleet.state(key),
    }
    if (error := h.fleet.error(key)) is not None:
        entry["load_error"] = error
    return entry


_DOCUMENT = "openapi_document"


@service.get("/openapi.json")
async def openapi_document() -> Response:
    """Built on first request, once every route is mounted, then kept."""
    document: dict[str, Any] | None = current_app.extensions.get(_DOCUMENT)
    if document is None:
        document = current_app.extensions[_DOCUMENT] = openapi_document_for(current_app)
    return json_response(document)
