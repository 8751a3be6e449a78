"""Two real MLX models in one server process (the tiny test model, loaded at start, and
the default model): an unload by hand, then an eviction, each arriving in the middle of
sixteen requests for the loaded model, some of them still being prepared. Every request
is served, the unload answers and the evicted model ends unloaded; nothing waits for
ever (each call is bounded, so a deadlock fails instead of hanging). Afterwards
`/health` answers and an ordinary request completes."""

from __future__ import annotations

import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest
from openai import OpenAI

from mlxcel.model.provision.fetch import default_model_dir

from server_process import ServerProcess, ServerProcesses
from tiny_model import ensure_tiny_model

pytestmark = pytest.mark.e2e

REQUESTS = 16
BOUND_SECS = 120
"""Each call's bound: sixteen short replies of the tiny model and one load of the
default model take a few seconds; a deadlock (the requests and the unload waiting on
each other) fails here."""
PROMPT = " ".join(f"word{i}" for i in range(600))
"""Long enough that preparing it (rendering, tokenizing) takes a while on its own."""


def _client(server: ServerProcess) -> OpenAI:
    return server.client().with_options(timeout=BOUND_SECS)


def _response(server: ServerProcess, model: str) -> str:
    done = _client(server).responses.create(model=model, input=PROMPT, max_output_tokens=2)
    return done.status


def _streamed(server: ServerProcess, model: str) -> str:
    stream = _client(server).responses.create(
        model=model, input=PROMPT, max_output_tokens=2, stream=True
    )
    return [event.type for event in stream][-1]


def _chat(server: ServerProcess, model: str) -> str:
    messages = [{"role": "user", "content": PROMPT}]
    done = _client(server).chat.completions.create(
        model=model,
        messages=messages,  # type: ignore[arg-type]
        max_tokens=2,
        n=2,
    )
    return str(done.choices[-1].finish_reason)


KINDS: tuple[Callable[[ServerProcess, str], str], ...] = (_response, _streamed, _chat)
DONE = {"completed", "incomplete", "response.completed", "response.incomplete", "length", "stop"}


def _race(server: ServerProcess, racer: Callable[[], str]) -> tuple[list[str], str]:
    """Sixteen requests for `tiny`, and `racer` sent among them once half are sent."""
    with ThreadPoolExecutor(REQUESTS + 1) as pool:

        def ask(count: int) -> list[Future[str]]:
            sent = []
            for i in range(count):
                sent.append(pool.submit(KINDS[i % len(KINDS)], server, "tiny"))
                time.sleep(0.01)  # a burst, spread so some are always being prepared
            return sent

        asked = ask(REQUESTS // 2)
        raced = pool.submit(racer)
        asked += ask(REQUESTS - REQUESTS // 2)
        answers = [f.result(timeout=BOUND_SECS + 10) for f in asked]
        return answers, raced.result(timeout=BOUND_SECS + 10)


def _unload(server: ServerProcess) -> str:
    r = httpx.post(f"{server.url}/v1/models/tiny/unload", timeout=BOUND_SECS)
    assert r.status_code == 200, r.text
    return "unloaded"


def _states(server: ServerProcess) -> dict[str, str]:
    with server.http() as http:
        models: dict[str, str] = http.get("/health").json()["models"]
    return models


def test_an_unload_and_an_eviction_racing_requests_in_preparation(tmp_path: Path) -> None:
    servers = ServerProcesses(tmp_path)
    try:
        tiny, coder = ensure_tiny_model(), default_model_dir()
        server = servers.launch_real(
            "--model", f"tiny={tiny}", "--model", f"coder={coder}", "--parallel", "4"
        )
        server.wait_ready()
        answers, unloaded = _race(server, lambda: _unload(server))
        assert set(answers) <= DONE, answers
        assert unloaded == "unloaded"
        answers, evictor = _race(server, lambda: _response(server, "coder"))
        assert set(answers) <= DONE, answers
        assert evictor in DONE  # `coder` was loaded: `tiny`'s unload ended
        # The requests sent after the eviction loaded `tiny` again, and so on: whichever
        # is loaded now, none is stuck on its way.
        assert sorted(_states(server).values()) == ["loaded", "unloaded"]
        with server.http() as http:
            assert http.get("/health").status_code == 200
        assert _response(server, "coder") in DONE  # an ordinary request
    finally:
        servers.close()
