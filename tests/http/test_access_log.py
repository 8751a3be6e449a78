"""The access log: one parseable INFO line per request on `mlxcel.access`, with its
method, path, status, duration, response id, key name and tokens (a stream's at its end);
never a key, never the request's text; and none with `access_log` off."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import Any

import httpx
import openai
import pytest
import trio
from openai import OpenAI
from openai.types.responses import Response

from mlxcel.http.guards import key_name

from support import FakeServer, StartServer, in_thread, wait_until

FIELDS = ("method", "path", "status", "ms", "id", "key", "in", "out")
PROMPT = "a prompt the log must never hold"


def access_lines(caplog: pytest.LogCaptureFixture) -> list[dict[str, str]]:
    """Every access-log line so far but `/health`'s, parsed (`key=value` pairs, in a fixed
    order). The test server's start polls `/health` until the model is ready; those
    lines are the fixture's, logged at a moment of their own."""
    lines = []
    for record in caplog.records:
        if record.name != "mlxcel.access":
            continue
        assert record.levelno == logging.INFO
        pairs = [word.split("=", 1) for word in record.getMessage().split(" ")]
        assert [name for name, _ in pairs] == list(FIELDS), record.getMessage()
        if dict(pairs)["path"] != "/health":
            lines.append(dict(pairs))
    return lines


async def next_line(caplog: pytest.LogCaptureFixture, seen: int) -> dict[str, str]:
    """The line after the first `seen` (written once the exchange is over, which may be
    just after the client has read the answer)."""
    with trio.fail_after(10):
        await wait_until(lambda: len(access_lines(caplog)) > seen)
    lines = access_lines(caplog)
    assert len(lines) == seen + 1, lines
    return lines[-1]


@pytest.fixture
def keyed(start_fake_server: StartServer) -> Iterator[tuple[StartServer, list[OpenAI]]]:
    clients: list[OpenAI] = []
    yield start_fake_server, clients
    for client in clients:
        client.close()


def sdk(server: FakeServer, key: str, clients: list[OpenAI]) -> OpenAI:
    client = OpenAI(base_url=f"{server.url}/v1", api_key=key, max_retries=0)
    clients.append(client)
    return client


async def test_lines_for_a_request_a_stream_a_401_and_a_404(
    keyed: tuple[StartServer, list[OpenAI]], caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    start, clients = keyed
    server = await start(api_keys=("sk-access-secret",))
    client = sdk(server, "sk-access-secret", clients)
    name = key_name("sk-access-secret")

    created = await in_thread(client.responses.create, model="fake-model", input=PROMPT)
    line = await next_line(caplog, 0)
    assert line["method"] == "POST"
    assert line["path"] == "/v1/responses"
    assert line["status"] == "200"
    assert float(line["ms"]) >= 0
    assert line["id"] == created.id
    assert line["key"] == name
    assert created.usage is not None
    assert (int(line["in"]), int(line["out"])) == (
        created.usage.input_tokens,
        created.usage.output_tokens,
    )

    def stream() -> Response:
        with client.responses.stream(model="fake-model", input=PROMPT) as events:
            return events.get_final_response()

    final = await in_thread(stream)
    line = await next_line(caplog, 1)
    assert (line["status"], line["id"], line["key"]) == ("200", final.id, name)
    assert final.usage is not None
    usage = final.usage
    assert (int(line["in"]), int(line["out"])) == (usage.input_tokens, usage.output_tokens)
    assert int(line["out"]) > 0

    wrong = sdk(server, "sk-wrong-secret", clients)
    with pytest.raises(openai.AuthenticationError):
        await in_thread(wrong.responses.create, model="fake-model", input=PROMPT)
    line = await next_line(caplog, 2)
    assert (line["status"], line["key"], line["id"], line["in"]) == ("401", "-", "-", "-")

    async with httpx.AsyncClient(base_url=server.url, timeout=30) as http:
        headers = {"Authorization": "Bearer sk-access-secret"}
        r = await http.get("/v1/no/such/route?q=secret", headers=headers)
        assert r.status_code == 404
        line = await next_line(caplog, 3)
        assert (line["method"], line["status"]) == ("GET", "404")
        assert line["path"] == "/v1/no/such/route?q"  # the parameter's name, not its value
        assert (line["key"], line["id"], line["out"]) == (name, "-", "-")

        r = await http.get(f"/v1/responses/{created.id}", headers=headers)
        assert r.status_code == 200
        line = await next_line(caplog, 4)
        assert (line["path"], line["id"]) == (f"/v1/responses/{created.id}", created.id)

    # What the server logged (the client libraries log their own requests, query included).
    text = "\n".join(
        r.getMessage() for r in caplog.records if not r.name.startswith(("httpx", "openai"))
    )
    assert "mlxcel.access" in {r.name for r in caplog.records}
    for secret in ("sk-access-secret", "sk-wrong-secret", PROMPT, "q=secret"):
        assert secret not in text


async def test_a_chat_stream_logs_its_usage_at_its_end(
    fake_server: FakeServer, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    client = fake_server.client()

    def stream() -> str:
        chunks = client.chat.completions.create(
            model="fake-model",
            messages=[{"role": "user", "content": PROMPT}],
            stream=True,
            stream_options={"include_usage": True},
        )
        return [chunk for chunk in chunks][-1].id

    chat_id = await in_thread(stream)
    line = await next_line(caplog, 0)
    assert line["path"] == "/v1/chat/completions"
    assert line["status"] == "200"
    assert line["key"] == "-"  # a server without keys: one tenant, no name
    assert chat_id.endswith(line["id"].removeprefix("resp_"))
    assert int(line["in"]) > 0
    assert int(line["out"]) > 0


async def test_no_lines_when_the_access_log_is_off(
    start_fake_server: StartServer, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    server = await start_fake_server(access_log=False)
    await in_thread(server.client().responses.create, model="fake-model", input="hi")
    async with httpx.AsyncClient(base_url=server.url, timeout=30) as http:
        assert (await http.get("/health")).status_code == 200
    assert not [r for r in caplog.records if r.name == "mlxcel.access"]  # /health's neither


async def test_a_message_and_its_stream_are_logged_with_their_usage(
    fake_server: FakeServer, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    client = fake_server.anthropic()
    asked = {
        "model": "fake-model",
        "max_tokens": 16,
        "messages": [{"role": "user", "content": PROMPT}],
    }
    created = await in_thread(client.messages.create, **asked)
    line = await next_line(caplog, 0)
    assert (line["path"], line["status"]) == ("/v1/messages", "200")
    assert line["id"] == "resp_" + created.id.removeprefix("msg_")
    usage = created.usage
    prompt = usage.input_tokens + usage.cache_read_input_tokens + usage.cache_creation_input_tokens
    assert (int(line["in"]), int(line["out"])) == (prompt, usage.output_tokens)

    def stream() -> Any:
        with client.messages.stream(**asked) as events:
            return events.get_final_message()

    final = await in_thread(stream)
    line = await next_line(caplog, 1)
    assert (line["path"], line["status"], line["out"]) == (
        "/v1/messages",
        "200",
        str(final.usage.output_tokens),
    )
    text = "\n".join(r.getMessage() for r in caplog.records if r.name == "mlxcel.access")
    assert PROMPT not in text
