"""Graceful shutdown: drain in process (fake engine), and signals to the real command."""

from __future__ import annotations

import functools
import json
import signal
import subprocess
import time
from collections.abc import Iterator

import httpx
import pytest
import trio

from mlxcel.app import serve
from mlxcel.config import Settings
from mlxcel.generation import ModelNames
from mlxcel.model.fake import FakeEngine, fake_factory

from server_process import ServerProcesses
from support import LONG
from tiny_model import ensure_tiny_model


async def _stream_events(url: str, body: dict[str, object], started: trio.Event) -> list[str]:
    """The event names of one stream, read to its end; `started` is set at the first delta."""
    names: list[str] = []
    async with (
        httpx.AsyncClient(base_url=url, timeout=30) as http,
        http.stream("POST", "/v1/responses", json={**body, "stream": True}) as r,
    ):
        assert r.status_code == 200
        async for line in r.aiter_lines():
            if line.startswith("event: "):
                names.append(line.removeprefix("event: "))
                if names[-1] == "response.output_text.delta":
                    started.set()
    return names


async def test_a_drain_finishes_short_responses_and_ends_the_rest(nursery: trio.Nursery) -> None:
    shutdown = trio.Event()
    stopped = trio.Event()
    settings = Settings(port=0, shutdown_timeout_secs=0.5)
    engine = FakeEngine(step_delay=0.01)
    engine.hold(on="w0")  # the long response (w0 w1 ...) runs until the drain ends it
    factory = functools.partial(fake_factory, engine)
    names = ModelNames("fake-model", "/models/fake")

    async def run(*, task_status: trio.TaskStatus[list[str]] = trio.TASK_STATUS_IGNORED) -> None:
        await serve(settings, factory, names, shutdown=shutdown, task_status=task_status)
        stopped.set()

    url = (await nursery.start(run))[0]
    results: dict[str, list[str]] = {}
    long_started, short_started = trio.Event(), trio.Event()

    async def one(key: str, text: str, started: trio.Event) -> None:
        results[key] = await _stream_events(url, {"model": "fake-model", "input": text}, started)

    async with trio.open_nursery() as clients:
        clients.start_soon(one, "long", LONG, long_started)
        clients.start_soon(one, "short", "echo: " + " ".join(["s"] * 20), short_started)
        await long_started.wait()
        await short_started.wait()
        shutdown.set()
        await trio.sleep(0.05)
        async with httpx.AsyncClient(base_url=url, timeout=5) as http:
            with pytest.raises(httpx.ConnectError):  # no longer accepting
                await http.get("/health")
    with trio.fail_after(10):
        await stopped.wait()
    # The short response finished within the drain; the long one was ended with its
    # closing events and one terminal event.
    assert results["short"][-1] == "response.completed"
    assert results["long"][-4:] == [
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.incomplete",
    ]


def _start(servers: ServerProcesses, *flags: str) -> tuple[subprocess.Popen[bytes], str]:
    """`mlxcel-server` on the tiny model, answering `/health` (the `servers` fixture kills
    it at the end)."""
    server = servers.launch_real("--model", str(ensure_tiny_model()), *flags)
    server.wait_ready()
    return server.proc, server.url


def _open_stream(client: httpx.Client) -> Iterator[str]:
    """A long stream's lines, read up to its first delta."""
    body = {"model": "tiny-qwen2-random", "input": "Count.", "max_output_tokens": 100_000}
    request = client.build_request("POST", "/v1/responses", json={**body, "stream": True})
    lines = client.send(request, stream=True).iter_lines()
    for line in lines:
        if line == "event: response.output_text.delta":
            return lines
    raise AssertionError("no delta")  # pragma: no cover


@pytest.mark.mlx
def test_sigterm_drains_and_exits_zero(servers: ServerProcesses) -> None:
    flags = ("--shutdown-timeout-secs", "1", "--ctx-size", "200000")
    proc, url = _start(servers, *flags)
    try:
        with httpx.Client(base_url=url, timeout=60) as client:
            stream = _open_stream(client)
            proc.send_signal(signal.SIGTERM)
            events = [
                json.loads(line.removeprefix("data: "))["type"]
                for line in stream
                if line.startswith("data: ")
            ]
        assert events[-1] == "response.incomplete"
        assert proc.wait(timeout=30) == 0
    finally:
        proc.kill()
        proc.wait()


@pytest.mark.mlx
def test_a_second_signal_stops_at_once(servers: ServerProcesses) -> None:
    flags = ("--shutdown-timeout-secs", "600", "--ctx-size", "200000")
    proc, url = _start(servers, *flags)
    try:
        with httpx.Client(base_url=url, timeout=60) as client:
            stream = _open_stream(client)  # held open (not read) while the server drains
            proc.send_signal(signal.SIGTERM)
            time.sleep(1)
            assert proc.poll() is None  # draining: the stream may run for 600 s
            proc.send_signal(signal.SIGTERM)
            assert proc.wait(timeout=30) == 0
            stream.close()
    finally:
        proc.kill()
        proc.wait()
