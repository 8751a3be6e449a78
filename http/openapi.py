"""The OpenAPI 3.1 document of every route the app mounts, served at `/openapi.json`.

Paths come from the app's URL map, so no mounted route is left out; request bodies are
the pydantic models' own JSON schemas (under `components/schemas`), so the document
describes exactly what the routes validate. Response bodies are described loosely (the
`openai` and `anthropic` SDKs' types are their reference); every error is the one OpenAI
error shape, or on the Anthropic routes Anthropic's. What each view is documented as
is `http/operations.py`'s table.
"""

from __future__ import annotations

import re
from typing import Any

from pydantic.json_schema import models_json_schema
from quart import Quart

from mlxcel import __version__
from mlxcel.http.operations import OPERATIONS, Operation

__all__ = ["OPERATIONS", "openapi_document_for"]

SCHEMAS = "#/components/schemas/"
_RULE_ARGUMENT = re.compile(r"<(?:[^<>:]+:)?([^<>]+)>")
_AUTOMATIC_METHODS = frozenset({"HEAD", "OPTIONS"})


_PATH_PARAMETERS = {
    "response_id": "A response id (`resp_…`).",
    "conversation_id": "A conversation id (`conv_…`).",
    "item_id": "An item id.",
    "model_id": "A name the loaded model answers to.",
}

_PAGE_PARAMETERS: list[dict[str, Any]] = [
    {
        "name": "after",
        "in": "query",
        "description": "List the items after the one with this id.",
        "schema": {"type": "string"},
    },
    {
        "name": "before",
        "in": "query",
        "description": "Accepted for compatibility and ignored.",
        "schema": {"type": "string"},
    },
    {
        "name": "limit",
        "in": "query",
        "description": "How many items a page holds.",
        "schema": {"type": "integer", "minimum": 1, "maximum": 100, "default": 20},
    },
    {
        "name": "order",
        "in": "query",
        "description": "`asc`: oldest first; `desc`: newest first.",
        "schema": {"type": "string", "enum": ["asc", "desc"], "default": "desc"},
    },
    {
        "name": "include",
        "in": "query",
        "description": "Accepted for compatibility and ignored.",
        "style": "form",
        "explode": True,
        "schema": {"type": "array", "items": {"type": "string"}},
    },
]

_ERROR_SCHEMA: dict[str, Any] = {
    "type": "object",
    "description": "Every error the server answers.",
    "properties": {
        "error": {
            "type": "object",
            "properties": {
                "message": {"type": "string"},
                "type": {"type": "string"},
                "param": {"type": ["string", "null"]},
                "code": {"type": ["string", "null"]},
            },
            "required": ["message", "type", "param", "code"],
        }
    },
    "required": ["error"],
}

_ANTHROPIC_ERROR_SCHEMA: dict[str, Any] = {
    "type": "object",
    "description": "Every error of the Anthropic routes (`request-id` header too).",
    "properties": {
        "type": {"const": "error"},
        "error": {
            "type": "object",
            "properties": {"type": {"type": "string"}, "message": {"type": "string"}},
            "required": ["type", "message"],
        },
        "request_id": {"type": "string"},
    },
    "required": ["type", "error", "request_id"],
}

_ERRORS = {
    "400": "The request is invalid (its body, a parameter or an id).",
    "401": "The API key is missing or wrong (only when the server has API keys).",
    "403": "The API key may not do this: loading and unloading models takes an admin key "
    "(`--admin-key`, or `admin=true` in the keys file) on a server with API keys.",
    "404": "No such model, stored response, conversation or item.",
    "408": "The request body did not arrive within the body deadline.",
    "413": "The request body is too large.",
    "415": "The request body is not JSON.",
    "409": "The model is pinned (`--pin`): it stays loaded.",
    "429": "Too many background jobs, or the API key spent a rate limit or its daily token "
    "quota (`--rate-limit-rpm`, `--rate-limit-tpm`, `--daily-token-quota`, "
    "`--admin-rate-limit-rpm`); retry after `Retry-After`.",
    "503": "Not now: the model is loading or could not be loaded (`model_load_failed`), "
    "every slot and queue place is taken, or the server is shutting down.",
    "529": "Overloaded: every slot and queue place is taken (Anthropic's status for it).",
}
_RETRY_AFTER = {
    "Retry-After": {
        "schema": {"type": "integer"},
        "description": "Seconds to wait before retrying, when that is likely to help (for a "
        "spent rate limit or quota: until its window ends).",
    }
}


def openapi_document_for(app: Quart) -> dict[str, Any]:
    """The OpenAPI 3.1 document of every route `app` mounts."""
    paths: dict[str, dict[str, Any]] = {}
    for rule in app.url_map.iter_rules():
        if rule.websocket:  # OpenAPI describes no WebSocket: the README does
            continue
        path = _RULE_ARGUMENT.sub(r"{\1}", rule.rule)
        for method in sorted(set(rule.methods or ()) - _AUTOMATIC_METHODS):
            paths.setdefault(path, {})[method.lower()] = _operation(
                rule.endpoint, sorted(rule.arguments)
            )
    return {
        "openapi": "3.1.0",
        "info": {
            "title": "mlxcel",
            "version": __version__,
            "description": "Local MLX language models behind the OpenAI Responses, Chat "
            "Completions and Completions APIs and Anthropic's Messages API. Every route is "
            "also mounted without the `/v1` prefix.",
        },
        "paths": dict(sorted(paths.items())),
        "components": {
            "schemas": {
                **_body_schemas(),
                "Error": _ERROR_SCHEMA,
                "AnthropicError": _ANTHROPIC_ERROR_SCHEMA,
            },
            "securitySchemes": {
                "apiKey": {
                    "type": "http",
                    "scheme": "bearer",
                    "description": "One of the server's API keys; needed only when it has some.",
                },
                "xApiKey": {
                    "type": "apiKey",
                    "in": "header",
                    "name": "x-api-key",
                    "description": "The same key, as Anthropic's clients send it.",
                },
            },
        },
        "security": [{"apiKey": []}, {"xApiKey": []}, {}],
    }


def _body_schemas() -> dict[str, Any]:
    models = {op.body for op in OPERATIONS.values() if op.body is not None}
    _, definitions = models_json_schema(
        [(model, "validation") for model in sorted(models, key=lambda m: m.__name__)],
        ref_template=SCHEMAS + "{model}",
    )
    return dict(sorted(definitions.get("$defs", {}).items()))


def _operation(endpoint: str, arguments: list[str]) -> dict[str, Any]:
    view = endpoint.rsplit(".", 1)[-1]  # blueprint.view
    known = OPERATIONS.get(view)
    op = known or Operation(view.replace("_", " ").capitalize(), "other", "A JSON object.")
    parameters = [
        {
            "name": name,
            "in": "path",
            "required": True,
            "description": _PATH_PARAMETERS.get(name, "An id."),
            "schema": {"type": "string", "minLength": 1},
        }
        for name in arguments
    ]
    if op.pages:
        parameters += _PAGE_PARAMETERS
    parameters += [
        {"name": name, "in": "query", "description": text, "schema": {"type": kind}}
        for name, kind, text in op.query
    ]
    json = op.content == "application/json"
    ok: dict[str, Any] = {op.content: {"schema": {"type": "object" if json else "string"}}}
    if op.streams:
        ok["text/event-stream"] = {"schema": {"type": "string"}}
    responses: dict[str, Any] = {"200": {"description": op.returns, "content": ok}}
    codes = {*op.refusals}
    codes |= {"400"} if op.body or op.pages or arguments else set()
    codes |= set() if op.public else {"401"}
    codes |= {"404"} if arguments else set()
    codes |= {"408", "413", "415"} if op.body else set()
    for code in sorted(codes):
        responses[code] = _error_response(code, retry=not op.public, anthropic=op.anthropic)
    operation: dict[str, Any] = {
        "operationId": endpoint,
        "summary": op.summary,
        "tags": [op.tag],
        "responses": responses,
    }
    if parameters:
        operation["parameters"] = parameters
    if op.body is not None:
        operation["requestBody"] = {
            "required": op.body_required,
            "content": {"application/json": {"schema": {"$ref": SCHEMAS + op.body.__name__}}},
        }
    if op.public:
        operation["security"] = []
    return operation


def _error_response(code: str, *, retry: bool, anthropic: bool = False) -> dict[str, Any]:
    schema = SCHEMAS + ("AnthropicError" if anthropic else "Error")
    response: dict[str, Any] = {
        "description": _ERRORS[code],
        "content": {"application/json": {"schema": {"$ref": schema}}},
    }
    if retry and code in ("429", "503", "529"):
        response["headers"] = _RETRY_AFTER
    return response
