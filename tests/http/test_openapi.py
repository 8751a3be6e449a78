"""The served OpenAPI document: valid OpenAPI 3.1, every mounted route, bodies from the
pydantic request models, one OpenAI error shape."""

from __future__ import annotations

import copy
import re
from collections.abc import Iterator
from typing import Any
from unittest.mock import MagicMock

import httpx
import jsonschema
import pytest
import schemathesis
from schemathesis.core.result import Ok

from mlxcel.config import Settings
from mlxcel.http.openapi import OPERATIONS
from mlxcel.http.routes import create_app
from mlxcel.http.schemas import CreateResponseBody

from support import FakeServer, StartServer

SCHEMAS = "#/components/schemas/"
PAGE_PARAMETERS = {"after", "before", "limit", "order", "include"}
PAGED = {"/responses/{response_id}/input_items", "/conversations/{conversation_id}/items"}


async def fetch(server: FakeServer, path: str = "/openapi.json", **kwargs: Any) -> httpx.Response:
    async with httpx.AsyncClient(base_url=server.url, timeout=30) as http:
        return await http.get(path, **kwargs)


@pytest.fixture
async def document(fake_server: FakeServer) -> dict[str, Any]:
    r = await fetch(fake_server)
    assert r.status_code == 200, r.text
    assert r.headers["content-type"].startswith("application/json")
    body: dict[str, Any] = r.json()
    return body


def references(node: Any) -> Iterator[str]:
    """Every `$ref` and discriminator mapping target in `node`."""
    if isinstance(node, dict):
        for key, value in node.items():
            if key == "$ref":
                yield value
            elif key == "mapping":
                yield from value.values()
            else:
                yield from references(value)
    elif isinstance(node, list):
        for value in node:
            yield from references(value)


def operations(document: dict[str, Any]) -> list[tuple[str, str, dict[str, Any]]]:
    return [
        (path, method, operation)
        for path, item in document["paths"].items()
        for method, operation in item.items()
    ]


async def test_the_document_is_served_with_and_without_v1(
    fake_server: FakeServer, document: dict[str, Any]
) -> None:
    assert document["openapi"] == "3.1.0"
    assert (await fetch(fake_server, "/v1/openapi.json")).json() == document


async def test_the_document_is_valid_openapi(document: dict[str, Any]) -> None:
    schema = schemathesis.openapi.from_dict(copy.deepcopy(document))
    schema.validate()
    loaded = list(schema.get_all_operations())
    assert all(isinstance(result, Ok) for result in loaded), loaded
    assert len(loaded) == len(operations(document))
    for body_schema in document["components"]["schemas"].values():
        jsonschema.Draft202012Validator.check_schema(body_schema)
    # The validation is real: a document without its `info` is refused.
    broken = copy.deepcopy(document)
    del broken["info"]
    with pytest.raises(Exception, match="info"):
        schemathesis.openapi.from_dict(broken).validate()


async def test_every_mounted_route_is_in_the_document(document: dict[str, Any]) -> None:
    app = create_app(MagicMock(), body_timeout_secs=Settings().body_timeout_secs)
    mounted = set()
    sockets = {rule.rule for rule in app.url_map.iter_rules() if rule.websocket}
    assert sockets == {"/v1/responses", "/responses"}  # WebSocket mode, not in the document
    for rule in app.url_map.iter_rules():
        if rule.websocket:
            continue
        path = re.sub(r"<(?:[^<>:]+:)?([^<>]+)>", r"{\1}", rule.rule)
        for method in set(rule.methods or ()) - {"HEAD", "OPTIONS"}:
            mounted.add((path, method.lower()))
            # Documented on purpose, not by a fallback.
            assert rule.endpoint.rsplit(".", 1)[-1] in OPERATIONS, rule.endpoint
    documented = {(path, method) for path, method, _ in operations(document)}
    assert documented == mounted
    assert {path for path, _ in mounted if not path.startswith("/v1/")} == {
        path.removeprefix("/v1") for path, _ in mounted if path.startswith("/v1/")
    } | {"/health", "/"}  # mounted once: readiness, and the root clients probe
    operation_ids = [op["operationId"] for _, _, op in operations(document)]
    assert len(set(operation_ids)) == len(operation_ids)


async def test_request_bodies_are_the_pydantic_models(document: dict[str, Any]) -> None:
    for prefix in ("", "/v1"):
        body = document["paths"][f"{prefix}/responses"]["post"]["requestBody"]
        assert body["required"] is True
        assert body["content"]["application/json"]["schema"] == {
            "$ref": SCHEMAS + "CreateResponseBody"
        }
    schemas = document["components"]["schemas"]
    create = schemas["CreateResponseBody"]
    expected = CreateResponseBody.model_json_schema(ref_template=SCHEMAS + "{model}")
    expected.pop("$defs")
    assert create == expected
    for name in ("input", "model", "stream", "background", "store", "instructions", "tools"):
        assert name in create["properties"], name
    for name in ("previous_response_id", "conversation", "temperature", "max_output_tokens"):
        assert name in create["properties"], name
    assert set(create["required"]) == {"model", "input"}
    # Every reference resolves to a component.
    refs = set(references(document))
    assert SCHEMAS + "MessageIn" in refs
    assert refs <= {SCHEMAS + name for name in schemas}
    # A compaction item carries the string a compaction produced.
    encrypted = schemas["CompactionIn"]["properties"]["encrypted_content"]
    assert encrypted["type"] == "string"


async def test_every_post_with_a_body_documents_it(document: dict[str, Any]) -> None:
    for path, method, operation in operations(document):
        if method != "post":
            continue
        if path.endswith(("/cancel", "}/load", "}/unload")):
            assert "requestBody" not in operation
            continue
        body = operation["requestBody"]
        assert body["required"] is not path.endswith("/conversations"), path
        assert body["content"]["application/json"]["schema"]["$ref"].startswith(SCHEMAS)


OWN_QUERY = {
    ("get", "/responses/{response_id}"): {"stream", "starting_after", "include_obfuscation"},
}
"""The routes with query parameters of their own (a background response's stream)."""


async def test_path_and_page_parameters(document: dict[str, Any]) -> None:
    for path, method, operation in operations(document):
        parameters = operation.get("parameters", [])
        in_path = {p["name"] for p in parameters if p["in"] == "path"}
        assert in_path == set(re.findall(r"{(\w+)}", path)), path
        assert all(p["required"] for p in parameters if p["in"] == "path")
        in_query = {p["name"] for p in parameters if p["in"] == "query"}
        pages = method == "get" and path.removeprefix("/v1") in PAGED
        own = OWN_QUERY.get((method, path.removeprefix("/v1")), set())
        assert in_query == (PAGE_PARAMETERS if pages else own), (path, method)
    limit = next(
        p
        for p in document["paths"]["/v1/responses/{response_id}/input_items"]["get"]["parameters"]
        if p["name"] == "limit"
    )
    assert limit["schema"] == {"type": "integer", "minimum": 1, "maximum": 100, "default": 20}


async def test_errors_are_one_openai_error_schema(
    fake_server: FakeServer, document: dict[str, Any]
) -> None:
    """Anthropic's routes aside (`test_anthropic_routes_answer_anthropic_errors`)."""
    error_schema = document["components"]["schemas"]["Error"]
    assert set(error_schema["properties"]["error"]["required"]) == {
        "message",
        "type",
        "param",
        "code",
    }
    for path, method, operation in operations(document):
        statuses = set(operation["responses"])
        assert "200" in statuses
        # Only the document and the root (open, with no input) never refuse.
        assert len(statuses) > 1 or path.endswith("openapi.json") or path == "/", (path, method)
        anthropic = path.removeprefix("/v1").startswith("/messages")
        for status, response in operation["responses"].items():
            if status != "200":
                schema = response["content"]["application/json"]["schema"]
                kind = "AnthropicError" if anthropic else "Error"
                assert schema == {"$ref": SCHEMAS + kind}, (path, method, status)
    # What the server answers fits it.
    async with httpx.AsyncClient(base_url=fake_server.url, timeout=30) as http:
        answers = [
            await http.get("/v1/responses/resp_missing"),
            await http.get("/v1/responses/not-an-id/input_items", params={"limit": 0}),
            await http.post("/v1/responses", json={"model": "fake-model"}),
            await http.get("/v1/nowhere"),
        ]
    for r in answers:
        assert r.status_code in (400, 404), r.text
        jsonschema.validate(r.json(), error_schema)


async def test_the_document_needs_the_api_key_like_the_other_routes(
    start_fake_server: StartServer,
) -> None:
    server = await start_fake_server(api_keys=("sk-right",))
    for path in ("/openapi.json", "/v1/openapi.json"):
        assert (await fetch(server, path)).status_code == 401
        answer = await fetch(server, path, headers={"Authorization": "Bearer sk-right"})
        assert answer.status_code == 200
        assert answer.json()["paths"]["/health"]["get"]["security"] == []
    assert (await fetch(server, "/health")).status_code == 200


async def test_anthropic_routes_answer_anthropic_errors(
    fake_server: FakeServer, document: dict[str, Any]
) -> None:
    for prefix in ("", "/v1"):
        create = document["paths"][f"{prefix}/messages"]["post"]
        assert create["requestBody"]["content"]["application/json"]["schema"] == {
            "$ref": SCHEMAS + "MessagesBody"
        }
        assert {"400", "401", "404", "413", "429", "529"} <= set(create["responses"])
        assert "Retry-After" in create["responses"]["529"]["headers"]
        count = document["paths"][f"{prefix}/messages/count_tokens"]["post"]
        assert count["requestBody"]["content"]["application/json"]["schema"] == {
            "$ref": SCHEMAS + "CountTokensBody"
        }
    schemas = document["components"]["schemas"]
    assert set(schemas["MessagesBody"]["required"]) == {"model", "messages", "max_tokens"}
    assert set(schemas["CountTokensBody"]["required"]) == {"model", "messages"}
    error_schema = schemas["AnthropicError"]
    async with httpx.AsyncClient(base_url=fake_server.url, timeout=30) as http:
        answers = [
            await http.post("/v1/messages", json={"model": "fake-model"}),
            await http.post("/v1/messages/count_tokens", json={"model": "x", "messages": []}),
            await http.post("/v1/messages/nowhere", json={}),
        ]
    for r in answers:
        assert r.status_code in (400, 404), r.text
        jsonschema.validate(r.json(), error_schema)
        assert r.json()["request_id"] == r.headers["request-id"]
