"""Streaming clients: one request against either server, and one level of N at once.

Ours is read through the Responses API (`response.output_text.delta` events), the peers
(mlx_lm.server, llama.cpp) through Chat Completions; both with the official `openai` SDK, one thread per request.
Every time is taken with `time.perf_counter()` against the level's shared origin.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import openai
from load import CpuSample, cpu_shares
from openai.types.responses import (
    ResponseCompletedEvent,
    ResponseErrorEvent,
    ResponseFailedEvent,
    ResponseIncompleteEvent,
    ResponseTextDeltaEvent,
)
from report import LevelResult

Kind = Literal["ours", "peer", "llamacpp"]


@dataclass(frozen=True)
class RequestSampling:
    """The sampling every request of a run asks for (`--temperature`, `--top-p`)."""

    temperature: float = 0.0
    top_p: float = 1.0


SAMPLING = RequestSampling()
"""Set once by `use_sampling` before a run; read by every request thread."""


def use_sampling(temperature: float, top_p: float) -> None:
    global SAMPLING
    SAMPLING = RequestSampling(temperature, top_p)


@dataclass
class RequestResult:
    index: int
    start: float
    """Seconds from the level's start to sending the request."""
    first_token: float | None = None
    """Seconds from the level's start to the first non-empty text delta."""
    end: float | None = None
    """Seconds from the level's start to the end of the stream (or the failure)."""
    deltas: int = 0
    gaps: list[float] = field(default_factory=list)
    """Seconds between consecutive non-empty text deltas."""
    output_tokens: int = 0
    usage_reported: bool = False
    prompt_tokens: int | None = None
    finish: str | None = None
    text_chars: int = 0
    error: dict[str, Any] | None = None

    @property
    def ok(self) -> bool:
        return self.error is None and self.first_token is not None and self.end is not None

    @property
    def ttft(self) -> float | None:
        return None if self.first_token is None else self.first_token - self.start

    @property
    def tpot(self) -> float | None:
        if self.first_token is None or self.end is None or self.output_tokens < 2:
            return None
        return (self.end - self.first_token) / (self.output_tokens - 1)

    @property
    def tokens_per_s(self) -> float | None:
        if self.end is None or self.end <= self.start:
            return None
        return self.output_tokens / (self.end - self.start)


class _Clock:
    """Records text deltas against a shared origin and enforces the request deadline."""

    def __init__(self, result: RequestResult, origin: float, deadline: float) -> None:
        self.result = result
        self.origin = origin
        self.deadline = deadline
        self._last: float | None = None

    def now(self) -> float:
        t = time.perf_counter()
        if t > self.deadline:
            raise TimeoutError("request exceeded --timeout")
        return t - self.origin

    def text(self, chunk: str | None) -> None:
        t = self.now()
        if not chunk:
            return
        r = self.result
        if r.first_token is None:
            r.first_token = t
        elif self._last is not None:
            r.gaps.append(t - self._last)
        self._last = t
        r.deltas += 1
        r.text_chars += len(chunk)


def _error(exc: BaseException) -> dict[str, Any]:
    if isinstance(exc, openai.APIStatusError):
        body: Any
        try:
            body = exc.response.json()
        except ValueError:
            body = exc.response.text[:2000]
        return {
            "kind": type(exc).__name__,
            "status": exc.status_code,
            "message": str(exc),
            "body": body,
        }
    cause = exc.__cause__ or exc.__context__
    return {
        "kind": type(exc).__name__,
        "status": None,
        "message": str(exc) or repr(exc),
        "cause": None if cause is None else f"{type(cause).__name__}: {cause}",
        "body": None,
    }


def stream_ours(
    client: openai.OpenAI, model: str, prompt: str, max_tokens: int, clock: _Clock
) -> None:
    r = clock.result
    stream = client.responses.create(
        model=model,
        input=prompt,
        max_output_tokens=max_tokens,
        temperature=SAMPLING.temperature,
        top_p=SAMPLING.top_p,
        stream=True,
    )
    with stream:
        for event in stream:
            if isinstance(event, ResponseTextDeltaEvent):
                clock.text(event.delta)
                continue
            clock.now()
            if isinstance(event, ResponseCompletedEvent | ResponseIncompleteEvent):
                r.finish = event.response.status
                if event.response.usage is not None:
                    r.output_tokens = event.response.usage.output_tokens
                    r.prompt_tokens = event.response.usage.input_tokens
                    r.usage_reported = True
            elif isinstance(event, ResponseFailedEvent):
                err = event.response.error
                r.error = {
                    "kind": "response.failed",
                    "status": 200,
                    "message": err.message if err else "",
                    "body": event.to_dict(),
                }
            elif isinstance(event, ResponseErrorEvent):
                r.error = {
                    "kind": "stream error event",
                    "status": 200,
                    "message": event.message,
                    "body": event.to_dict(),
                }


def stream_peer(
    client: openai.OpenAI, model: str, prompt: str, max_tokens: int, clock: _Clock
) -> None:
    r = clock.result
    stream = client.chat.completions.create(
        model=model,
        messages=[{"role": "user", "content": prompt}],
        max_tokens=max_tokens,
        temperature=SAMPLING.temperature,
        top_p=SAMPLING.top_p,
        stream=True,
        stream_options={"include_usage": True},
    )
    with stream:
        for chunk in stream:
            for choice in chunk.choices:
                clock.text(choice.delta.content)
                if choice.finish_reason is not None:
                    r.finish = choice.finish_reason
            clock.now()
            if chunk.usage is not None:
                r.output_tokens = chunk.usage.completion_tokens
                r.prompt_tokens = chunk.usage.prompt_tokens
                r.usage_reported = True


Streamer = Callable[[openai.OpenAI, str, str, int, _Clock], None]
# llama.cpp is read exactly as mlx_lm.server is, through Chat Completions.
STREAMERS: dict[Kind, Streamer] = {
    "ours": stream_ours,
    "peer": stream_peer,
    "llamacpp": stream_peer,
}


def run_request(
    streamer: Streamer,
    client: openai.OpenAI,
    model: str,
    prompt: str,
    max_tokens: int,
    result: RequestResult,
    origin: float,
    deadline: float,
) -> None:
    clock = _Clock(result, origin, deadline)
    try:
        streamer(client, model, prompt, max_tokens, clock)
    except Exception as exc:
        result.error = _error(exc)
    result.end = time.perf_counter() - origin
    if not result.usage_reported:
        result.output_tokens = result.deltas  # best effort: one delta per token
    if result.error is None and result.finish is None:
        result.error = {
            "kind": "no terminal event",
            "status": 200,
            "message": "the stream ended without a completed/incomplete event or finish_reason",
            "body": None,
        }
    if result.error is None and result.first_token is None:
        result.error = {
            "kind": "no text",
            "status": 200,
            "finish": result.finish,
            "message": "the stream ended without any text delta",
            "body": None,
        }


def make_client(base_url: str, timeout: float) -> openai.OpenAI:
    return openai.OpenAI(
        base_url=base_url.rstrip("/") + "/v1",
        api_key=os.environ.get("MLXCEL_BENCH_API_KEY", "bench"),
        max_retries=0,
        timeout=openai.Timeout(timeout, connect=10.0),
    )


def join_all(
    threads: Sequence[threading.Thread],
    results: Sequence[RequestResult],
    origin: float,
    deadline: float,
) -> None:
    """Wait for the request threads; one still running past `deadline` (plus the read
    timeout's slack) is recorded as hung."""
    hard_deadline = deadline + 30.0  # the read timeout can add to --timeout
    for t in threads:
        # Short slices: a long lock wait would delay Ctrl-C / SIGTERM until it returns.
        while t.is_alive() and time.perf_counter() < hard_deadline:
            t.join(0.5)
    for t, r in zip(threads, results, strict=True):
        if t.is_alive() and r.end is None:
            r.end = time.perf_counter() - origin
            r.error = {
                "kind": "hung",
                "status": None,
                "body": None,
                "message": "the client thread did not finish before the deadline",
            }


def run_level(
    kind: Kind,
    base_url: str,
    model: str,
    prompts: Sequence[str],
    max_tokens: int,
    timeout: float,
    server_pid: int | None = None,
) -> LevelResult:
    """Fire len(prompts) streams at once; returns when all ended or --timeout passed."""
    n = len(prompts)
    client = make_client(base_url, timeout)
    barrier = threading.Barrier(n + 1)
    results = [RequestResult(index=i, start=0.0) for i in range(n)]
    origin_box: list[float] = []

    def worker(i: int) -> None:
        barrier.wait()
        origin = origin_box[0]
        results[i].start = time.perf_counter() - origin
        run_request(
            STREAMERS[kind],
            client,
            model,
            prompts[i],
            max_tokens,
            results[i],
            origin,
            origin + timeout,
        )

    threads = [threading.Thread(target=worker, args=(i,), daemon=True) for i in range(n)]
    for t in threads:
        t.start()
    cpu_before = CpuSample.take(server_pid)
    origin_box.append(time.perf_counter())
    barrier.wait()
    join_all(threads, results, origin_box[0], origin_box[0] + timeout)
    wall = max((r.end or 0.0) for r in results)
    cpu = cpu_shares(cpu_before, CpuSample.take(server_pid), time.perf_counter() - origin_box[0])
    client.close()
    return LevelResult(n=n, wall_s=wall, requests=results, cpu=cpu)
