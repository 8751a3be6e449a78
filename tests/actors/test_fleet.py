"""The fleet of models and its leases, on fake engines and Trio's autojump clock (no
HTTP): loads, evictions, leases (one per request, shared by its streams, raced by
unloads), idle unloads, pins and failed loads."""

from __future__ import annotations

import functools
import threading
from collections.abc import Awaitable

import pytest
import trio
import trio.testing

from mlxcel.config import Settings, StoreLimits
from mlxcel.errors import ConfigError, ModelLoadFailed, ModelNotFound, ModelPinned
from mlxcel.fleet import ConfiguredModel, EngineSpec, Fleet
from mlxcel.generation import GenerationRequest, ModelNames, Sampling
from mlxcel.items import RequestEcho, ResponseRecord, new_id
from mlxcel.metrics import Metrics
from mlxcel.model.engine import LoadedModel
from mlxcel.model.fake import FakeCodec, FakeEngine, fake_factory
from mlxcel.respond.events import ResponseFinished
from mlxcel.store import StoreActor

DEFAULTS = Settings()


class Loads:
    """Counts the loads of each model and can make one fail or wait at a gate."""

    def __init__(self) -> None:
        self.count: dict[str, int] = {}
        self.fail: set[str] = set()
        self.gate = threading.Event()
        self.gate.set()
        self.engines: dict[str, FakeEngine] = {}

    def factory(self, name: str) -> LoadedModel:
        self.count[name] = self.count.get(name, 0) + 1
        self.gate.wait(10)
        if name in self.fail:
            raise OSError(f"{name}: model.safetensors is truncated")
        engine = self.engines[name] = FakeEngine()
        return fake_factory(engine)


async def start(
    nursery: trio.Nursery,
    loads: Loads,
    names: tuple[str, ...] = ("a", "b"),
    *,
    max_loaded: int = 1,
    idle: float = 0.0,
    pinned: tuple[str, ...] = (),
    metrics: Metrics | None = None,
    depth: int = 4,
) -> Fleet:
    limits = StoreLimits(100, 1 << 20, 0)
    store = await nursery.start(
        StoreActor(limits, limits, DEFAULTS.background_ephemeral_ttl_secs).run
    )
    spec = EngineSpec(store, store.echo, 2, depth, 10.0, DEFAULTS.send_timeout_secs, Metrics())
    models = [
        ConfiguredModel(
            ModelNames(n, f"/models/{n}"), functools.partial(loads.factory, n), n in pinned
        )
        for n in names
    ]
    fleet = Fleet(models, spec, max_loaded=max_loaded, idle_unload_secs=idle, metrics=metrics)
    started: Fleet = await nursery.start(fleet.run)
    return started


def request(model: str, text: str = "echo: hello there") -> GenerationRequest:
    record = ResponseRecord(
        id=new_id("resp"), created_at=0, status="in_progress", echo=RequestEcho(model=model)
    )
    prompt = FakeCodec().render([{"role": "user", "content": text}], None)
    return GenerationRequest(record, tuple(prompt), Sampling(max_tokens=50))


async def generate(fleet: Fleet, model: str, text: str = "echo: hello there") -> ResponseRecord:
    """One request for `model`, as a route runs it: under one lease from start to end."""
    async with fleet.open_model(model) as lease:
        return await lease.generate(request(model, text))


async def at_once(
    fleet: Fleet, models: list[str], besides: Awaitable[None] | None = None
) -> list[ResponseRecord]:
    """A request for each of `models`, all at once (and `besides` among them)."""
    records: list[ResponseRecord] = []

    async def ask(model: str) -> None:
        records.append(await generate(fleet, model))

    async def other() -> None:
        if besides is not None:
            await besides

    async with trio.open_nursery() as together:
        together.start_soon(ask, models[0])
        together.start_soon(other)
        for model in models[1:]:
            together.start_soon(ask, model)
    return records


async def until(fleet: Fleet, model: str, state: str) -> None:
    with trio.fail_after(30):
        while fleet.state(model) != state:  # noqa: ASYNC110 - the fleet has no such event
            await trio.sleep(0.01)


async def test_requests_load_their_model_and_alternate_at_a_limit_of_one(
    nursery: trio.Nursery, autojump_clock: trio.testing.MockClock
) -> None:
    loads = Loads()
    fleet = await start(nursery, loads)
    await until(fleet, "a", "loaded")
    assert fleet.state("b") == "unloaded"
    for model in ("b", "a", "b"):
        record = await generate(fleet, model)
        assert record.status == "completed"
        assert fleet.state(model) == "loaded"
        other = "a" if model == "b" else "b"
        assert fleet.state(other) == "unloaded"
    assert loads.count == {"a": 2, "b": 2}


async def test_a_storm_of_requests_shares_one_load(
    nursery: trio.Nursery, autojump_clock: trio.testing.MockClock
) -> None:
    loads = Loads()
    fleet = await start(nursery, loads)
    await until(fleet, "a", "loaded")
    records = await at_once(fleet, ["b"] * 6)  # two slots and four places in the line
    assert [r.status for r in records] == ["completed"] * 6
    assert loads.count["b"] == 1


async def test_the_evicted_model_waits_for_its_running_work(
    nursery: trio.Nursery, autojump_clock: trio.testing.MockClock
) -> None:
    """Work on `a` (a held response, as a background job's) holds `b`'s load until it
    ends; it is never cut."""
    loads = Loads()
    fleet = await start(nursery, loads)
    await until(fleet, "a", "loaded")
    loads.engines["a"].hold()
    async with fleet.open_model("a") as lease:  # the stream outlives the request's block
        held = lease.stream(request("a"), waits=True)
        await held.submit()
    nursery.start_soon(generate, fleet, "b")
    await until(fleet, "a", "unloading")
    await trio.sleep(5)
    assert fleet.state("a") == "unloading"
    assert loads.count.get("b", 0) == 0
    loads.engines["a"].release()
    async with held:
        events = [e async for e in held]
    assert isinstance(events[-1], ResponseFinished)
    assert events[-1].record.status == "completed"
    await until(fleet, "b", "loaded")
    assert fleet.state("a") == "unloaded"


async def test_idle_models_unload_and_load_again(
    nursery: trio.Nursery, autojump_clock: trio.testing.MockClock
) -> None:
    loads = Loads()
    fleet = await start(nursery, loads, max_loaded=2, idle=1.0)
    await until(fleet, "a", "loaded")
    await generate(fleet, "b")
    await until(fleet, "a", "unloaded")
    await until(fleet, "b", "unloaded")
    assert (await generate(fleet, "a")).status == "completed"
    assert loads.count == {"a": 2, "b": 1}


async def test_running_work_holds_the_idle_timer(
    nursery: trio.Nursery, autojump_clock: trio.testing.MockClock
) -> None:
    loads = Loads()
    fleet = await start(nursery, loads, idle=1.0)
    await until(fleet, "a", "loaded")
    loads.engines["a"].hold()
    async with fleet.open_model("a") as lease:
        stream = lease.stream(request("a"))
        await stream.submit()
    await trio.sleep(10)
    assert fleet.state("a") == "loaded"
    loads.engines["a"].release()
    async with stream:
        assert [e async for e in stream][-1].record.status == "completed"  # type: ignore[attr-defined]
    await until(fleet, "a", "unloaded")


async def test_pinned_models_stay_and_refuse_unload(
    nursery: trio.Nursery, autojump_clock: trio.testing.MockClock
) -> None:
    loads = Loads()
    fleet = await start(nursery, loads, ("a", "b", "c"), max_loaded=2, pinned=("b",))
    await until(fleet, "b", "loaded")
    await until(fleet, "a", "loaded")
    with pytest.raises(ModelPinned):
        await fleet.unload("b")
    for model in ("c", "a", "c"):
        await generate(fleet, model)
        assert fleet.state("b") == "loaded"
    assert loads.count["b"] == 1


async def test_a_model_that_fails_to_load_fails_its_requests_alone(
    nursery: trio.Nursery, autojump_clock: trio.testing.MockClock
) -> None:
    loads = Loads()
    loads.fail.add("b")
    metrics = Metrics()
    fleet = await start(nursery, loads, metrics=metrics)
    await until(fleet, "a", "loaded")
    with pytest.raises(ModelLoadFailed, match="truncated") as info:
        await generate(fleet, "b")
    assert info.value.code == "model_load_failed"
    assert fleet.state("b") == "unloaded"
    assert "truncated" in (fleet.error("b") or "")
    assert (await generate(fleet, "a")).status == "completed"
    assert metrics.model_loads.labels("b", "failed")._value.get() == 1
    loads.fail.clear()  # mended: the next request loads it
    assert (await generate(fleet, "b")).status == "completed"


async def test_an_unload_racing_a_request_serves_the_request(
    nursery: trio.Nursery, autojump_clock: trio.testing.MockClock
) -> None:
    loads = Loads()
    fleet = await start(nursery, loads)
    await until(fleet, "a", "loaded")
    records = await at_once(fleet, ["a", "a"], fleet.unload("a"))
    assert [r.status for r in records] == ["completed", "completed"]
    assert fleet.state("a") in ("loaded", "unloaded")


@pytest.mark.parametrize("racer", ["unload", "eviction"])
async def test_an_unload_racing_requests_in_preparation_serves_them_first(
    nursery: trio.Nursery, racer: str
) -> None:
    """Sixteen requests hold `a` while they are prepared when an unload begins (by hand,
    or to make room for `b`): each submits through the lease it holds, so each is served
    and the unload ends after them. None waits on the unload that waits on it. (On the
    real clock: the loads run on model threads, and a jumping clock would reach the
    deadline while one works.)"""
    loads = Loads()
    fleet = await start(nursery, loads, depth=16)
    await until(fleet, "a", "loaded")
    prepared, holding, statuses = trio.Event(), trio.Semaphore(0), []

    async def ask_a() -> None:
        async with fleet.open_model("a") as lease:
            holding.release()
            await prepared.wait()  # its preparation, under its lease
            statuses.append((await lease.generate(request("a"))).status)

    with trio.fail_after(30):  # a deadlock fails here
        async with trio.open_nursery() as racing:
            for _ in range(16):
                racing.start_soon(ask_a)
            for _ in range(16):
                await holding.acquire()
            if racer == "unload":
                racing.start_soon(fleet.unload, "a")
            else:
                racing.start_soon(generate, fleet, "b")
            await until(fleet, "a", "unloading")
            prepared.set()
    assert statuses == ["completed"] * 16
    assert fleet.state("a") == "unloaded"
    assert fleet.state("b") == ("unloaded" if racer == "unload" else "loaded")
    assert (await generate(fleet, "a")).status == "completed"


async def test_a_lease_shared_by_a_stream_holds_the_model_until_the_stream_closes(
    nursery: trio.Nursery, autojump_clock: trio.testing.MockClock
) -> None:
    """The request's block ends once its stream is submitted; the stream keeps the model,
    and the unload waits for it to close, however late."""
    loads = Loads()
    fleet = await start(nursery, loads)
    await until(fleet, "a", "loaded")
    async with fleet.open_model("a") as lease:
        stream = lease.stream(request("a"))
        await stream.submit()
    nursery.start_soon(fleet.unload, "a")
    await until(fleet, "a", "unloading")
    await trio.sleep(30)
    assert fleet.state("a") == "unloading"
    async with stream:
        assert [e async for e in stream][-1].record.status == "completed"  # type: ignore[attr-defined]
    await until(fleet, "a", "unloaded")
    with pytest.raises(RuntimeError):
        lease.share()  # ended with its block: nothing may lean on it any more


async def test_a_requester_leaving_during_a_load_leaves_nothing_held(
    nursery: trio.Nursery, autojump_clock: trio.testing.MockClock
) -> None:
    loads = Loads()
    fleet = await start(nursery, loads, idle=1.0)
    await until(fleet, "a", "loaded")
    loads.gate.clear()
    with trio.move_on_after(0.5):
        await generate(fleet, "b")
    loads.gate.set()
    await until(fleet, "b", "loaded")
    await until(fleet, "b", "unloaded")  # no lease left behind holds its idle timer


def test_names_pins_and_limits_are_checked() -> None:
    spec = EngineSpec(None, None, 1, 1, 1.0, 1.0, Metrics())  # type: ignore[arg-type]
    a = ConfiguredModel(ModelNames("a", "/m/a", ("claude-*",)), fake_factory)
    b = ConfiguredModel(ModelNames("b", "/m/claude-b"), fake_factory, pinned=True)
    fleet = Fleet([a, b], spec, max_loaded=2)
    assert fleet.find(None) == "a"
    assert fleet.find("claude-b") == "b"  # its own folder's name before a's pattern
    assert fleet.find("CLAUDE-opus") == "a"
    with pytest.raises(ModelNotFound) as info:
        fleet.find("gpt-4o")
    assert info.value.code == "model_not_found"
    with pytest.raises(ConfigError):
        Fleet([a, b], spec, max_loaded=1)  # the pin leaves no room for a
