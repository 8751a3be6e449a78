"""Helpers shared by tests (fixtures live in conftest.py)."""

from __future__ import annotations

import functools
import json
import socket
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import trio
from anthropic import Anthropic
from openai import OpenAI

from mlxcel.config import Settings
from mlxcel.model.fake import FakeEngine

LONG_WORDS = 400
LONG = "echo: " + " ".join(f"w{i}" for i in range(LONG_WORDS))
"""A prompt the fake engine answers with `LONG_WORDS` words, `w0 w1 ...`: a response that
stays in flight while the engine is held (`FakeEngine.hold`), or runs long at a step delay."""


@dataclass
class FakeServer:
    url: str
    engine: FakeEngine
    settings: Settings
    _clients: list[OpenAI | Anthropic] = field(default_factory=list)

    def client(self, api_key: str = "sk-no-auth", **kwargs: Any) -> OpenAI:
        """An SDK client for this server (with `api_key`), closed when the test ends."""
        client = OpenAI(base_url=f"{self.url}/v1", api_key=api_key, max_retries=0, **kwargs)
        self._clients.append(client)
        return client

    def anthropic(self, api_key: str | None = "sk-no-auth", **kwargs: Any) -> Anthropic:
        """An `anthropic` SDK client for this server, closed when the test ends."""
        client = Anthropic(base_url=self.url, api_key=api_key, max_retries=0, **kwargs)
        self._clients.append(client)
        return client

    def close(self) -> None:
        for client in self._clients:
            client.close()


StartServer = Callable[..., Awaitable[FakeServer]]
KeysFile = Callable[[str], Path]
"""The `keys_file` fixture: writes the test's keys file with a text and returns its path."""


async def in_thread(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """Run a blocking SDK call off the Trio thread (the server runs on it)."""
    return await trio.to_thread.run_sync(functools.partial(fn, *args, **kwargs))


async def wait_until(predicate: Callable[[], bool]) -> None:
    """Poll state another thread owns (the model thread's engine) until it holds.

    Callers bound the wait with `trio.fail_after`."""
    while not predicate():  # noqa: ASYNC110 - the state is not ours to signal
        await trio.sleep(0.01)


def key_prefix() -> str:
    """A Redis key prefix no other test or server uses (the session's Redis is shared)."""
    return f"t-{uuid.uuid4().hex[:12]}"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def pieces(tokenizer: Any, text: str) -> list[str]:
    """`text` as a model emits it: the newly decodable text of one token at a time."""
    ids = tokenizer.encode(text, add_special_tokens=False).ids
    out, done = [], ""
    for i in range(1, len(ids) + 1):
        now = tokenizer.decode(ids[:i], skip_special_tokens=False)
        out.append(now[len(done) :])
        done = now
    assert "".join(out) == text
    return out


async def post(server: FakeServer, path: str, body: dict[str, Any]) -> httpx.Response:
    """A raw JSON POST, for what the SDK would refuse to send or parse."""
    async with httpx.AsyncClient(base_url=server.url, timeout=30) as http:
        return await http.post(path, json=body)


async def count(server: FakeServer, body: dict[str, Any]) -> int:
    """`/v1/responses/input_tokens` for `body`."""
    r = await post(server, "/v1/responses/input_tokens", body)
    assert r.status_code == 200, r.text
    assert r.json()["object"] == "response.input_tokens"
    return int(r.json()["input_tokens"])


async def raw_request(
    url: str, body: dict[str, Any], *, rcvbuf: int | None = None, path: str = "/v1/responses"
) -> trio.SocketStream:
    """A whole POST (to /v1/responses unless `path` says) sent on a raw connection that is
    then left to the caller."""
    host, port = url.removeprefix("http://").split(":")
    payload = json.dumps(body).encode()
    head = (
        f"POST {path} HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(payload)}\r\n\r\n"
    ).encode()
    sock = trio.socket.socket()
    if rcvbuf is not None:  # a small window: the server's writes block once it is full
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
    await sock.connect((host, int(port)))
    stream = trio.SocketStream(sock)
    await stream.send_all(head + payload)
    return stream


async def read_until(stream: trio.SocketStream, marker: bytes) -> bytes:
    seen = b""
    while marker not in seen:
        chunk = await stream.receive_some()
        assert chunk, f"the stream ended before {marker!r}: {seen[-500:]!r}"
        seen += chunk
    return seen


async def read_releasing(
    http: httpx.AsyncClient,
    path: str,
    body: dict[str, Any],
    engine: FakeEngine,
    when: Callable[[str], bool],
) -> str:
    """The whole body of a streamed POST; the held `engine` is released once the text
    read so far satisfies `when` (a response queued behind a held one sees the wait)."""
    text = ""
    async with http.stream("POST", path, json=body) as r:
        async for chunk in r.aiter_text():
            text += chunk
            if not engine.gate.is_set() and when(text):
                engine.release()
    return text


async def queued_becomes(url: str, count: int, within: float = 5) -> None:
    """Poll `/health` until `count` requests wait in the queue."""
    async with httpx.AsyncClient(base_url=url, timeout=30) as http:
        with trio.fail_after(within):
            while (await http.get("/health")).json()["slots"]["queued"] != count:  # noqa: ASYNC110 - polled over HTTP
                await trio.sleep(0.01)


async def an_ordinary_request_completes(server: FakeServer, within: float = 10) -> None:
    """`/health` answers and a short request completes (retrying 503s while a slot frees)."""
    async with httpx.AsyncClient(base_url=server.url, timeout=30) as http:
        with trio.fail_after(within):
            assert (await http.get("/health")).status_code == 200
            while True:
                r = await http.post("/v1/responses", json={"model": "fake-model", "input": "hi"})
                if r.status_code != 503:
                    break
                await trio.sleep(0.02)
    assert r.status_code == 200, r.text
    assert r.json()["status"] == "completed"


def chat_body(path: str, text: str, **extra: Any) -> dict[str, Any]:
    """A body for `path`: Chat Completions (`text` as the user message) or Completions
    (`text` as the prompt)."""
    if path.endswith("/chat/completions"):
        return {"model": "fake-model", "messages": [{"role": "user", "content": text}], **extra}
    return {"model": "fake-model", "prompt": text, **extra}
