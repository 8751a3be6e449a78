"""What the resume tests share: a background response of the fake engine, its events read
over raw HTTP, and the SDK's stream of them broken and resumed."""

from __future__ import annotations

import httpx
from openai.types.responses import Response

from support import FakeServer, in_thread

WORDS = " ".join(f"w{i}" for i in range(40))


def frames(body: bytes) -> list[bytes]:
    """The body's event frames, keep-alive comments left out."""
    return [f + b"\n\n" for f in body.split(b"\n\n") if f and not f.startswith(b":")]


async def background(server: FakeServer, text: str = WORDS) -> str:
    queued = await in_thread(
        server.client().responses.create,
        model="fake-model",
        input=f"echo: {text}",
        background=True,
    )
    return str(queued.id)


async def events_of(server: FakeServer, response_id: str, **query: object) -> bytes:
    async with httpx.AsyncClient(base_url=server.url, timeout=30) as http:
        r = await http.get(f"/v1/responses/{response_id}", params={"stream": "true", **query})
    assert r.status_code == 200, r.text
    assert r.headers["content-type"].startswith("text/event-stream")
    return r.content


def read_until_break(server: FakeServer, response_id: str, last: int) -> list[int]:
    """The SDK's stream of the response, dropped after event `last`."""
    seen = []
    with server.client().responses.retrieve(response_id, stream=True) as stream:
        for event in stream:
            seen.append(event.sequence_number)
            if event.sequence_number == last:
                break
    return seen


def resume_to_end(server: FakeServer, response_id: str, after: int) -> tuple[list[int], Response]:
    numbers, final = [], None
    stream = server.client().responses.retrieve(response_id, stream=True, starting_after=after)
    with stream:
        for event in stream:
            numbers.append(event.sequence_number)
            if event.type in ("response.completed", "response.failed", "response.incomplete"):
                final = event.response
    assert final is not None
    return numbers, final
