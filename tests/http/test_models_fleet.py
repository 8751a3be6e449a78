"""Several models by name over real HTTP with the OpenAI SDK, on fake engines: listing
with states, routing by `model`, chains that switch model, loads on demand at a limit
of one, progress while a stream waits for a load, the load and unload routes, pins and
a model that fails to load; hostile clients end with `/health` and a request served."""

from __future__ import annotations

import functools
import json
import threading
from collections.abc import Awaitable, Callable
from typing import Any

import httpx
import openai
import pytest
import trio

from mlxcel.app import serve
from mlxcel.config import Settings
from mlxcel.fleet import ConfiguredModel
from mlxcel.generation import ModelNames
from mlxcel.model.engine import LoadedModel
from mlxcel.model.fake import FakeEngine, fake_factory

from support import in_thread

Start = Callable[..., Awaitable[tuple[str, dict[str, FakeEngine], threading.Event]]]


@pytest.fixture
def start(nursery: trio.Nursery) -> Start:
    """Starts a server with fake models `a` (the default) and `b`; `b`'s loads wait at
    the returned gate, and a name in `broken` fails to load."""

    async def started(
        broken: tuple[str, ...] = (), **settings: Any
    ) -> tuple[str, dict[str, FakeEngine], threading.Event]:
        engines = {"a": FakeEngine(step_delay=0.002), "b": FakeEngine(step_delay=0.002)}
        gate = threading.Event()
        gate.set()

        def load(name: str) -> LoadedModel:
            if name == "b":
                gate.wait(30)
            if name in broken:
                raise OSError(f"{name}: config.json is not JSON")
            return fake_factory(engines[name])

        models = [ModelNames(n, f"/models/{n}") for n in ("a", "b")]
        more = [ConfiguredModel(models[1], functools.partial(load, "b"))]
        config = Settings(port=0, **settings)
        run = functools.partial(serve, more=more)
        urls = await nursery.start(run, config, functools.partial(load, "a"), models[0])
        await _health(urls[0])
        return urls[0], engines, gate

    return started


async def _health(url: str) -> dict[str, Any]:
    async with httpx.AsyncClient(base_url=url, timeout=30) as http:
        with trio.fail_after(30):
            while (r := await http.get("/health")).status_code != 200:  # noqa: ASYNC110
                await trio.sleep(0.01)
    body: dict[str, Any] = r.json()
    return body


def _client(url: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{url}/v1", api_key="sk-none", max_retries=0, timeout=30)


def _list(url: str) -> Any:
    with _client(url) as client:
        return client.models.list()


def _create(url: str, **kw: Any) -> Any:
    with _client(url) as client:
        return client.responses.create(**kw)


async def _states(url: str) -> dict[str, str]:
    listed = await in_thread(_list, url)
    return {m.id: m.model_extra["state"] for m in listed.data}


async def _ask(url: str, model: str, text: str = "echo: hello", **kw: Any) -> Any:
    return await in_thread(_create, url, model=model, input=text, **kw)


async def test_two_models_listed_routed_and_chained(start: Start) -> None:
    url, engines, _ = await start(max_loaded_models=2)
    assert await _states(url) == {"a": "loaded", "b": "unloaded"}
    first = await _ask(url, "a", "echo: from a")
    assert (first.model, first.output_text) == ("a", "from a")
    assert "from a" in engines["a"].last_prompt
    second = await _ask(url, "b", "echo: then b", previous_response_id=first.id)
    assert (second.model, second.output_text) == ("b", "then b")
    assert "from a" in engines["b"].last_prompt  # the chain's history, read by b
    assert await _states(url) == {"a": "loaded", "b": "loaded"}
    with pytest.raises(openai.NotFoundError) as info:
        await _ask(url, "c")
    assert info.value.code == "model_not_found"
    async with httpx.AsyncClient(base_url=url, timeout=30) as http:
        assert (await http.get("/v1/models/b")).json()["state"] == "loaded"


async def test_a_limit_of_one_flips_the_states(start: Start) -> None:
    url, _, _ = await start()
    for model, other in (("b", "a"), ("a", "b"), ("b", "a")):
        assert (await _ask(url, model)).model == model
        states = await _states(url)
        assert (states[model], states[other]) == ("loaded", "unloaded")
    health = await _health(url)
    assert health["models"] == {"a": "unloaded", "b": "loaded"}
    async with httpx.AsyncClient(base_url=url, timeout=30) as http:
        text = (await http.get("/metrics")).text
    for model, loads in (("a", 2), ("b", 2)):  # a at start and once more; b twice
        assert f'mlxcel_model_loads_total{{model="{model}",outcome="loaded"}} {loads}.0' in text
        assert f'mlxcel_response_duration_seconds_count{{model="{model}"}}' in text
    assert 'mlxcel_model_unloads_total{model="a"} 2.0' in text


async def test_other_routes_name_their_model(start: Start) -> None:
    url, _, _ = await start()
    async with httpx.AsyncClient(base_url=url, timeout=30) as http:
        messages = [{"role": "user", "content": "echo: chat b"}]
        r = await http.post("/v1/chat/completions", json={"model": "b", "messages": messages})
        assert r.json()["choices"][0]["message"]["content"] == "chat b"
        r = await http.post("/v1/completions", json={"model": "a", "prompt": "x"})
        assert r.status_code == 200, r.text
        body = {"model": "b", "max_tokens": 8, "messages": messages}
        r = await http.post("/v1/messages/count_tokens", json=body)
        assert r.json()["input_tokens"] > 0
        r = await http.post("/v1/responses/input_tokens", json={"model": "c", "input": "x"})
        assert r.json()["error"]["code"] == "model_not_found"


async def test_a_stream_waiting_for_a_load_gets_progress(start: Start) -> None:
    url, _, gate = await start(sse_keepalive_secs=0.1)
    gate.clear()
    types: list[str] = []
    async with (
        httpx.AsyncClient(base_url=url, timeout=30) as http,
        http.stream(
            "POST", "/v1/responses", json={"model": "b", "input": "echo: late", "stream": True}
        ) as r,
    ):
        assert r.status_code == 200
        async for line in r.aiter_lines():
            if line.startswith("data: "):
                types.append(json.loads(line[6:])["type"])
                if types.count("mlx.progress") == 3:
                    gate.set()
    assert types[:3] == ["mlx.progress"] * 3
    assert types[3] == "response.created"
    assert types[-1] == "response.completed"


async def test_load_unload_routes_and_pins(start: Start) -> None:
    url, _, _ = await start(max_loaded_models=2, pinned_models=("a",))
    async with httpx.AsyncClient(base_url=url, timeout=30) as http:
        r = await http.post("/v1/models/b/load")
        assert r.json()["state"] == "loaded"
        r = await http.post("/models/unload", json={"model": "b"})
        assert (r.json()["state"], r.json()["success"]) == ("unloaded", True)
        r = await http.post("/v1/models/a/unload")
        assert r.status_code == 409
        assert r.json()["error"]["code"] == "model_pinned"
        r = await http.post("/models/load", json={"model": "nope"})
        assert r.status_code == 404
        r = await http.post("/models/load", json={"model": 3})
        assert r.status_code == 400
    assert await _states(url) == {"a": "loaded", "b": "unloaded"}


async def test_a_model_that_fails_to_load(start: Start) -> None:
    url, _, _ = await start(broken=("b",))
    with pytest.raises(openai.InternalServerError) as info:
        await _ask(url, "b")
    assert info.value.status_code == 503
    assert info.value.code == "model_load_failed"
    assert "config.json is not JSON" in str(info.value.message)
    async with httpx.AsyncClient(base_url=url, timeout=30) as http:
        body = {"model": "b", "input": "x", "stream": True}
        r = await http.post("/v1/responses", json=body)
        assert r.status_code == 200
        assert '"code":"model_load_failed"' in r.text  # one error event, no traceback
        assert "Traceback" not in r.text
    assert (await _ask(url, "a")).output_text  # the other serves on
    assert (await _health(url))["models"]["a"] == "loaded"


async def _read_all(http: httpx.AsyncClient, body: dict[str, Any]) -> None:
    """Read a whole answer (an SSE stream to its end)."""
    async with http.stream("POST", "/v1/responses", json=body) as r:
        async for _ in r.aiter_bytes():
            pass


async def test_clients_hanging_up_during_a_load(start: Start) -> None:
    url, _, gate = await start()
    gate.clear()
    async with httpx.AsyncClient(base_url=url, timeout=0.3) as http:
        for stream in (False, True, False):
            body = {"model": "b", "input": "x", "stream": stream}
            with pytest.raises(httpx.ReadTimeout):
                await _read_all(http, body)
    gate.set()
    with trio.fail_after(30):
        while (await _states(url))["b"] != "loaded":  # noqa: ASYNC110 - polls as clients do
            await trio.sleep(0.05)
    assert (await _ask(url, "a")).model == "a"  # b had no lease left behind: it unloads
    assert (await _health(url))["models"] == {"a": "loaded", "b": "unloaded"}


async def test_a_background_job_holds_the_next_load_until_it_ends(start: Start) -> None:
    url, engines, _ = await start()
    engines["a"].hold()
    job = await _ask(url, "a", "echo: one two three", background=True)
    answers: list[Any] = []

    async def ask_b() -> None:
        answers.append(await _ask(url, "b", "echo: after"))

    async with trio.open_nursery() as waiting:
        waiting.start_soon(ask_b)
        with trio.fail_after(10):
            while (await _states(url))["a"] != "unloading":  # noqa: ASYNC110 - polls as clients do
                await trio.sleep(0.02)
        await trio.sleep(0.3)
        assert await _states(url) == {"a": "unloading", "b": "loading"}  # b waits for room
        assert answers == []
        engines["a"].release()
    assert answers[0].output_text == "after"
    with _client(url) as client:
        done = await in_thread(client.responses.retrieve, job.id)
    assert (done.status, done.output_text) == ("completed", "one two three")
    assert await _states(url) == {"a": "unloaded", "b": "loaded"}
