"""The soak's clients: background jobs that are polled or cancelled, and streams that read
to the end, hang up, stall or get cancelled. Each tallies one outcome per request.

Normal paths use the `openai` SDK; hang-ups use httpx (leaving the response unread
closes the connection) and stalls a raw socket with a tiny receive buffer, which simply
stops being read.
"""

from __future__ import annotations

import asyncio
import collections
import json
import random
import re
import socket
import time
from collections.abc import Awaitable
from dataclasses import dataclass, field
from typing import Any

import httpx
import openai
from openai.types.responses import (
    ResponseCompletedEvent,
    ResponseCreatedEvent,
    ResponseErrorEvent,
    ResponseFailedEvent,
    ResponseIncompleteEvent,
)

TERMINAL_STATUSES = ("completed", "incomplete", "failed", "cancelled")
TERMINAL_EVENTS = ("response.completed", "response.incomplete", "response.failed")
OUTCOMES = (
    "completed",
    "incomplete",
    "cancelled",
    "failed",
    "503",
    "429",
    "5xx",
    "error",
    "lost",
    "stuck",
)
"""`failed`: a server error ended the response. `error`: a connection error or an
unexpected 4xx. A stream that hangs up, even right after `response.created`, must still
be found stored: never appearing is `lost`."""
JOB_KINDS = {"job": 0.6, "job-cancel": 0.25, "job-cancel-running": 0.15}
STREAM_KINDS = {
    "stream-read": 0.4,
    "stream-hangup": 0.2,
    "stream-stall": 0.15,
    "stream-cancel": 0.25,
}
SUBJECTS = ("a stack", "a queue", "an LRU cache", "a trie", "a ring buffer", "a bitset")
LANGUAGES = ("Python", "Rust", "Go", "C", "TypeScript", "Haskell")
TERMINAL_EVENT_TYPES = (ResponseCompletedEvent, ResponseIncompleteEvent, ResponseFailedEvent)
RESPONSE_ID = re.compile(rb'"id":"(resp_[A-Za-z0-9_-]+)"')


@dataclass
class Tally:
    counts: collections.Counter[tuple[str, str]] = field(default_factory=collections.Counter)
    problems: list[str] = field(default_factory=list)
    cancels: collections.Counter[str] = field(default_factory=collections.Counter)
    """The status each `POST /cancel` answered with, or its HTTP error."""
    stalls: collections.Counter[str] = field(default_factory=collections.Counter)
    """Whether a stalled stream's response ended while the client still held it."""

    def add(self, kind: str, outcome: str, detail: str | None = None) -> None:
        self.counts[kind, outcome] += 1
        if detail is not None:
            self.problems.append(f"{kind}: {outcome}: {detail}")

    def total(self, outcome: str) -> int:
        return sum(n for (_, o), n in self.counts.items() if o == outcome)


@dataclass
class Soak:
    host: str
    port: int
    model: str
    end: float
    """`time.monotonic()` after which no client starts a new request."""
    deadline: float
    """`time.monotonic()` by which every response must have ended."""
    api: openai.AsyncOpenAI
    http: httpx.AsyncClient
    send_timeout: float
    tally: Tally = field(default_factory=Tally)


def pick(rng: random.Random, weights: dict[str, float]) -> str:
    return rng.choices(list(weights), list(weights.values()))[0]


def request_body(
    s: Soak, rng: random.Random, tokens: tuple[int, int], **extra: Any
) -> dict[str, Any]:
    text = (
        f"In {rng.choice(LANGUAGES)}, write {rng.choice(SUBJECTS)} "
        f"with {rng.randint(2, 9)} methods. Number {rng.randint(0, 10**6)}."
    )
    return {
        "model": s.model,
        "input": text,
        "store": True,
        "max_output_tokens": rng.randint(*tokens),
        **extra,
    }


def http_outcome(status: int, text: str) -> str:
    if status == 503 and "server_overloaded" in text:
        return "503"
    if status == 429:
        return "429"
    return "5xx" if status >= 500 else "error"


async def guarded(s: Soak, kind: str, request: Awaitable[None]) -> None:
    """Run one request to its end, tallying what the request itself did not."""
    try:
        async with asyncio.timeout_at(s.deadline):
            await request
    except TimeoutError:
        s.tally.add(kind, "stuck", "did not end by the deadline")
    except openai.APIStatusError as exc:
        outcome = http_outcome(exc.status_code, exc.response.text)
        detail = (
            None if outcome in ("503", "429") else f"{exc.status_code} {exc.response.text[:300]}"
        )
        s.tally.add(kind, outcome, detail)
        if outcome in ("503", "429"):
            await asyncio.sleep(1.0)
    except Exception as exc:  # a connection error, a malformed reply: tallied, never fatal
        s.tally.add(kind, "error", f"{type(exc).__name__}: {exc}")


async def cancel(s: Soak, response_id: str) -> None:
    reply = await s.http.post(f"/v1/responses/{response_id}/cancel")
    if reply.status_code == 200:
        s.tally.cancels[reply.json()["status"]] += 1
    else:
        s.tally.cancels[f"HTTP {reply.status_code}"] += 1
        s.tally.problems.append(f"cancel {response_id}: {reply.status_code} {reply.text[:300]}")


async def settle(
    s: Soak,
    rng: random.Random,
    kind: str,
    response_id: str,
    *,
    stored: bool,
    cancel_in: float | None = None,
    cancel_once_running: float | None = None,
) -> None:
    """Poll the stored response until it ends, cancelling it on the way if asked.

    `stored`: it must exist already (a job); otherwise 404 means "not ended yet" (a stream
    is stored when it ends) until the deadline, and never appearing is a loss.
    """
    cancel_at = None if cancel_in is None else time.monotonic() + cancel_in
    status = "never stored"
    while time.monotonic() < s.deadline:
        reply = await s.http.get(f"/v1/responses/{response_id}")
        if reply.status_code == 404 and not stored:
            await asyncio.sleep(1.0)
            continue
        if reply.status_code != 200:
            lost = reply.status_code == 404
            outcome = "lost" if lost else http_outcome(reply.status_code, reply.text)
            s.tally.add(kind, outcome, f"{response_id} GET {reply.status_code} {reply.text[:300]}")
            return
        stored, status = True, reply.json()["status"]
        if status in TERMINAL_STATUSES:
            s.tally.add(kind, status, response_id if status == "failed" else None)
            return
        if cancel_once_running is not None and status == "in_progress":
            cancel_at, cancel_once_running = time.monotonic() + cancel_once_running, None
        if cancel_at is not None and time.monotonic() >= cancel_at:
            cancel_at = None
            await cancel(s, response_id)
        await asyncio.sleep(rng.uniform(1.0, 3.0))
    s.tally.add(kind, "stuck" if stored else "lost", f"{response_id}: last status {status}")


async def one_job(s: Soak, rng: random.Random, kind: str) -> None:
    body = request_body(s, rng, (16, 32), background=True)
    job = await s.api.responses.create(**body)
    await settle(
        s,
        rng,
        kind,
        job.id,
        stored=True,
        cancel_in=rng.uniform(0, 30) if kind == "job-cancel" else None,
        cancel_once_running=rng.uniform(0, 4) if kind == "job-cancel-running" else None,
    )


async def cancel_later(s: Soak, response_id: str, delay: float, fired: asyncio.Event) -> None:
    await asyncio.sleep(delay)
    fired.set()
    await cancel(s, response_id)


async def stream_to_end(s: Soak, rng: random.Random, kind: str) -> None:
    """Read the whole stream: exactly one terminal event must end it."""
    response_id, terminal, errors = "?", list[str](), 0
    canceller: asyncio.Task[None] | None = None
    fired = asyncio.Event()
    try:
        stream = await s.api.responses.create(**request_body(s, rng, (16, 32)), stream=True)
        async with stream:
            async for event in stream:
                if isinstance(event, ResponseCreatedEvent):
                    response_id = event.response.id
                    if kind == "stream-cancel":
                        delay = rng.uniform(0, 30)
                        canceller = asyncio.create_task(cancel_later(s, response_id, delay, fired))
                elif isinstance(event, TERMINAL_EVENT_TYPES):
                    terminal.append(str(event.response.status))
                elif isinstance(event, ResponseErrorEvent):
                    errors += 1
    finally:
        if canceller is not None and not fired.is_set():
            canceller.cancel()  # the stream ended first
        elif canceller is not None:
            await canceller  # the cancel was sent: take its answer
    detail = f"{response_id}: terminal events {terminal}, error events {errors}"
    if errors:
        s.tally.add(kind, "failed", detail)
    elif len(terminal) != 1:
        s.tally.add(kind, "lost", detail)
    else:
        s.tally.add(kind, terminal[0], detail if terminal[0] == "failed" else None)


async def stream_hang_up(s: Soak, rng: random.Random, kind: str) -> None:
    """Hang up right after `response.created`, or a few events after it started."""
    early, after = rng.random() < 0.25, rng.randint(0, 8)
    response_id, started, seen = None, False, 0
    body = request_body(s, rng, (16, 32), stream=True)
    async with s.http.stream("POST", "/v1/responses", json=body) as reply:
        if reply.status_code != 200:
            text = (await reply.aread()).decode(errors="replace")
            outcome = http_outcome(reply.status_code, text)
            s.tally.add(kind, outcome, None if outcome in ("503", "429") else text[:300])
            return
        async for line in reply.aiter_lines():
            if not line.startswith("data: "):
                continue
            event = json.loads(line[6:])
            if event["type"] == "response.created":
                response_id = event["response"]["id"]
                if early:
                    break
            started = started or event["type"] == "response.in_progress"
            seen += started
            if seen > after or event["type"] in TERMINAL_EVENTS:
                break
    # Leaving the block unread closes the connection.
    if response_id is None:
        s.tally.add(kind, "lost", "no response.created")
        return
    # Queued or running when its client left, the response is stored (cancelled).
    await settle(s, rng, kind, response_id, stored=False)


async def stream_stall(s: Soak, rng: random.Random, kind: str) -> None:
    """Read until the response runs, then stop reading for 2-8 send timeouts, and close.

    20 top logprobs make each delta event ~2 KB, so a few tokens fill the socket buffers
    and the server's send deadline can run out while the client still holds the
    connection: the server should then end the response (`cancelled`) and free its slot.
    """
    loop = asyncio.get_running_loop()
    body = request_body(s, rng, (48, 64), stream=True, top_logprobs=20)
    data = json.dumps(body).encode()
    head = (
        f"POST /v1/responses HTTP/1.1\r\nHost: {s.host}:{s.port}\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(data)}\r\n"
        "Connection: close\r\n\r\n"
    ).encode()
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1024)
        sock.setblocking(False)
        await loop.sock_connect(sock, (s.host, s.port))
        await loop.sock_sendall(sock, head + data)
        seen = b""
        while b"response.in_progress" not in seen:
            chunk = await loop.sock_recv(sock, 512)
            if not chunk:
                break
            seen += chunk
        status = int(seen.split(b" ", 2)[1]) if seen.startswith(b"HTTP/") else 0
        if status != 200:
            outcome = http_outcome(status, seen.decode(errors="replace"))
            s.tally.add(kind, outcome, None if outcome in ("503", "429") else repr(seen[:300]))
            return
        found = RESPONSE_ID.search(seen)
        if found is None or b"response.in_progress" not in seen:
            s.tally.add(kind, "lost", f"stream ended before it ran: {seen[-300:]!r}")
            return
        response_id = found.group(1).decode()
        await asyncio.sleep(rng.uniform(2 * s.send_timeout, 8 * s.send_timeout))
        ended = await s.http.get(f"/v1/responses/{response_id}")
        state = ended.json()["status"] if ended.status_code == 200 else "not stored"
        held = state in TERMINAL_STATUSES
        s.tally.stalls[f"ended while held: {state}" if held else "closed by the client"] += 1
    await settle(s, rng, kind, response_id, stored=False)


async def job_client(s: Soak, seed: int) -> None:
    rng = random.Random(seed)
    while time.monotonic() < s.end:
        kind = pick(rng, JOB_KINDS)
        await guarded(s, kind, one_job(s, rng, kind))


async def stream_client(s: Soak, seed: int) -> None:
    rng = random.Random(seed)
    await asyncio.sleep(rng.uniform(0, 2))
    while time.monotonic() < s.end:
        kind = pick(rng, STREAM_KINDS)
        if kind == "stream-hangup":
            request = stream_hang_up(s, rng, kind)
        elif kind == "stream-stall":
            request = stream_stall(s, rng, kind)
        else:
            request = stream_to_end(s, rng, kind)
        await guarded(s, kind, request)
