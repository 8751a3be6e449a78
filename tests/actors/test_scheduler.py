"""The scheduler with the model actor and store, on the fake engine (no HTTP)."""

from __future__ import annotations

import functools

import pytest
import trio

from mlxcel.actors.echo import EchoActor
from mlxcel.actors.messages import (
    Generate,
    GenerationRequest,
    OutputTextDelta,
    ResponseEvent,
    ResponseFinished,
)
from mlxcel.actors.scheduler import Scheduler, SchedulerHandle
from mlxcel.actors.store import StoreActor, StoreHandle
from mlxcel.config import StoreLimits
from mlxcel.errors import QueueFull
from mlxcel.items import RequestEcho, ResponseRecord, new_id
from mlxcel.model.actor import ModelActor
from mlxcel.model.engine import Sampling
from mlxcel.model.fake import FakeCodec, FakeEngine, fake_factory

from support import wait_until


async def start(
    nursery: trio.Nursery, engine: FakeEngine, parallel: int = 2, depth: int = 4
) -> tuple[SchedulerHandle, StoreHandle]:
    store = await nursery.start(StoreActor(StoreLimits(100, 1 << 20, 0), StoreLimits(0, 0, 0)).run)
    model = await nursery.start(ModelActor(functools.partial(fake_factory, engine), parallel).run)
    await model.ready.wait()
    echo = await nursery.start(EchoActor(0).run)
    scheduler = Scheduler(
        model, store, echo, parallel=parallel, max_queue_depth=depth, keepalive_secs=10
    )
    return await nursery.start(scheduler.run), store


def request(text: str, store: bool = True, max_tokens: int = 100) -> GenerationRequest:
    record = ResponseRecord(
        id=new_id("resp"),
        created_at=0,
        status="in_progress",
        echo=RequestEcho(model="m", store=store),
    )
    prompt = FakeCodec().render([{"role": "user", "content": text}], None)
    return GenerationRequest(record, tuple(prompt), Sampling(max_tokens=max_tokens))


async def collect(scheduler: SchedulerHandle, req: GenerationRequest) -> list[ResponseEvent]:
    send, recv = trio.open_memory_channel[ResponseEvent](0)
    await scheduler.submit(Generate(req, send))
    async with recv:
        return [event async for event in recv]


async def test_response_is_stored_before_it_is_reported(nursery: trio.Nursery) -> None:
    scheduler, store = await start(nursery, FakeEngine())
    req = request("echo: stored first")
    send, recv = trio.open_memory_channel[ResponseEvent](0)
    await scheduler.submit(Generate(req, send))
    async with recv:
        async for event in recv:
            if isinstance(event, ResponseFinished):
                assert await store.get(req.record.id) == event.record
                assert event.record.output_text == "stored first"


async def test_store_false_is_not_stored(nursery: trio.Nursery) -> None:
    scheduler, store = await start(nursery, FakeEngine())
    req = request("echo: ephemeral", store=False)
    events = await collect(scheduler, req)
    assert isinstance(events[-1], ResponseFinished)
    assert await store.get(req.record.id) is None


async def test_queue_bound_and_slots(nursery: trio.Nursery) -> None:
    engine = FakeEngine(step_delay=0.01)
    scheduler, _ = await start(nursery, engine, parallel=1, depth=1)
    long = "echo: " + " ".join(["w"] * 50)
    first_send, first_recv = trio.open_memory_channel[ResponseEvent](100)
    await scheduler.submit(Generate(request(long), first_send))
    await first_recv.receive()  # the slot has taken it
    second_send, second_recv = trio.open_memory_channel[ResponseEvent](100)
    await scheduler.submit(Generate(request("echo: queued"), second_send))
    with pytest.raises(QueueFull):
        await scheduler.submit(
            Generate(request("echo: refused"), trio.open_memory_channel[ResponseEvent](1)[0])
        )
    with trio.fail_after(10):
        async with first_recv, second_recv:
            first = [e async for e in first_recv]
            second = [e async for e in second_recv]
    assert isinstance(first[-1], ResponseFinished)
    assert isinstance(second[-1], ResponseFinished)
    assert second[-1].record.output_text == "queued"


async def test_leaving_requester_frees_its_slot(nursery: trio.Nursery) -> None:
    engine = FakeEngine(step_delay=0.01)
    scheduler, _ = await start(nursery, engine, parallel=1, depth=0)
    long = "echo: " + " ".join(["w"] * 500)
    send, recv = trio.open_memory_channel[ResponseEvent](0)
    await scheduler.submit(Generate(request(long, max_tokens=1000), send))
    async with recv:
        async for event in recv:
            if isinstance(event, OutputTextDelta):
                break
    with trio.fail_after(5):
        while True:
            try:
                events = await collect(scheduler, request("echo: next"))
                break
            except QueueFull:
                await trio.sleep(0.01)
    assert isinstance(events[-1], ResponseFinished)
    with trio.fail_after(5):  # the model thread drops it at its next step
        await wait_until(lambda: engine.active == 0)
    assert engine.steps < 100
