"""`--model-alias PATTERN=NAME` on every route that takes a model name: a name matching a
pattern is served (and echoed as sent), any other unknown name is a 404
`model_not_found` (`not_found_error` on the Messages routes) that lists the patterns; an alias to a model not served stops the
server at start."""

from __future__ import annotations

from typing import Any

import httpx
import pytest
import trio

from mlxcel.app import serve
from mlxcel.config import Settings
from mlxcel.errors import ConfigError
from mlxcel.generation import ModelNames
from mlxcel.model.fake import fake_factory

from support import FakeServer, StartServer

ALIASES = (("claude-*", "fake-model"), ("gpt-?o", "/models/fake"))

COMPACTABLE = [
    *(
        {"role": role, "content": f"turn {n}: " + "lorem ipsum " * 15}
        for n in range(6)
        for role in ("user", "assistant")
    ),
    {"role": "user", "content": "echo: and now?"},
]
"""A history with whole turns before its last message, so a compaction has work."""

ROUTES: tuple[tuple[str, dict[str, Any]], ...] = (
    ("/v1/responses", {"input": "echo: via responses"}),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "echo: via chat"}]}),
    ("/v1/completions", {"prompt": "echo: via completions", "max_tokens": 8}),
    ("/v1/responses/input_tokens", {"input": "echo: counted"}),
    ("/v1/responses/compact", {"input": COMPACTABLE}),
)


async def _post(server: FakeServer, path: str, body: dict[str, Any]) -> httpx.Response:
    async with httpx.AsyncClient(base_url=server.url, timeout=30) as http:
        return await http.post(path, json=body)


@pytest.mark.parametrize(("path", "body"), ROUTES, ids=[p for p, _ in ROUTES])
async def test_a_name_matching_a_pattern_is_served_on_every_route(
    start_fake_server: StartServer, path: str, body: dict[str, Any]
) -> None:
    server = await start_fake_server(model_aliases=ALIASES)
    for name in ("claude-sonnet-4-5", "CLAUDE-haiku", "gpt-4o"):
        r = await _post(server, path, {"model": name, **body})
        assert r.status_code == 200, r.text
        if "model" in r.json():  # the answer names the model as the request did
            assert r.json()["model"] == name
    r = await _post(server, path, {"model": "gpt-4.1", **body})
    assert r.status_code == 404, r.text
    error = r.json()["error"]
    assert error["code"] == "model_not_found"
    assert "'fake-model', 'claude-*', 'gpt-?o'" in error["message"]


async def test_without_aliases_a_tier_name_is_not_found(fake_server: FakeServer) -> None:
    r = await _post(fake_server, "/v1/responses", {"model": "claude-sonnet-4-5", "input": "hi"})
    assert r.status_code == 404
    assert r.json()["error"]["code"] == "model_not_found"
    r = await _post(fake_server, "/v1/responses", {"model": "fake-model", "input": "echo: ok"})
    assert r.json()["model"] == "fake-model"


async def test_an_alias_to_another_model_stops_the_server_at_start() -> None:
    settings = Settings(port=0, model_aliases=(("claude-*", "qwen3-coder"),))
    with pytest.raises(ConfigError, match="qwen3-coder") as info, trio.fail_after(10):
        await serve(settings, fake_factory, ModelNames("fake-model", "/m/f"))
    assert "--model-alias" in info.value.message


MESSAGES = {"max_tokens": 16, "messages": [{"role": "user", "content": "echo: via messages"}]}


@pytest.mark.parametrize("path", ["/v1/messages", "/v1/messages/count_tokens"])
async def test_the_messages_routes_take_aliases_and_answer_not_found_error(
    start_fake_server: StartServer, path: str
) -> None:
    server = await start_fake_server(model_aliases=ALIASES)
    r = await _post(server, path, {"model": "claude-opus-4-1", **MESSAGES})
    assert r.status_code == 200, r.text
    if path == "/v1/messages":
        assert r.json()["model"] == "claude-opus-4-1"
        assert r.json()["content"][0]["text"] == "via messages"
    r = await _post(server, path, {"model": "gpt-4.1", **MESSAGES})
    assert r.status_code == 404, r.text
    assert r.json()["type"] == "error"
    assert r.json()["error"]["type"] == "not_found_error"
    assert "'fake-model', 'claude-*', 'gpt-?o'" in r.json()["error"]["message"]
