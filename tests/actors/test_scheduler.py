"""The scheduler with the model actor and store, on the fake engine (no HTTP)."""

from __future__ import annotations

import functools

import pytest
import trio
import trio.testing

from mlxcel.actors.response_stream import submit_together
from mlxcel.actors.scheduler import Scheduler, SchedulerHandle
from mlxcel.config import Settings, StoreLimits
from mlxcel.errors import QueueFull, ShuttingDown
from mlxcel.generation import GenerationRequest, Sampling
from mlxcel.items import RequestEcho, ResponseRecord, new_id
from mlxcel.model.actor import ModelActor
from mlxcel.model.fake import FakeCodec, FakeEngine, fake_factory
from mlxcel.respond.events import (
    KeepAlive,
    OutputTextDelta,
    OutputTextDone,
    ResponseEvent,
    ResponseFinished,
    StreamError,
)
from mlxcel.store import StoreActor, StoreHandle

from support import wait_until

DEFAULTS = Settings()


async def start(
    nursery: trio.Nursery,
    engine: FakeEngine,
    parallel: int = 2,
    depth: int = 4,
    keepalive: float = 10,
) -> tuple[SchedulerHandle, StoreHandle]:
    limits = StoreLimits(100, 1 << 20, 0)
    store = await nursery.start(
        StoreActor(limits, limits, DEFAULTS.background_ephemeral_ttl_secs).run
    )
    model = await nursery.start(ModelActor(functools.partial(fake_factory, engine), parallel).run)
    await model.ready.wait()
    scheduler = Scheduler(
        model,
        store,
        store.echo,
        parallel=parallel,
        max_queue_depth=depth,
        keepalive_secs=keepalive,
        send_timeout_secs=DEFAULTS.send_timeout_secs,
    )
    return await nursery.start(scheduler.run), store


def request(
    text: str, store: bool = True, max_tokens: int = 100, conversation: str | None = None
) -> GenerationRequest:
    record = ResponseRecord(
        id=new_id("resp"),
        created_at=0,
        status="in_progress",
        echo=RequestEcho(model="m", conversation_id=conversation),
        store=store,
    )
    prompt = FakeCodec().render([{"role": "user", "content": text}], None)
    return GenerationRequest(record, tuple(prompt), Sampling(max_tokens=max_tokens))


async def collect(scheduler: SchedulerHandle, req: GenerationRequest) -> list[ResponseEvent]:
    async with scheduler.stream(req) as events:
        await events.submit()
        return [event async for event in events]


async def test_response_is_stored_before_it_is_reported(nursery: trio.Nursery) -> None:
    scheduler, store = await start(nursery, FakeEngine())
    req = request("echo: stored first")
    async with scheduler.stream(req) as events:
        await events.submit()
        async for event in events:
            if isinstance(event, ResponseFinished):
                assert await store.get(req.record.id) == event.record
                assert event.record.output_text == "stored first"


async def test_every_event_of_a_stream_names_its_response(nursery: trio.Nursery) -> None:
    """Keep-alives and a failure's error event too, not only the builder's events."""
    engine = FakeEngine(step_delay=0.05, fail_on="boom")
    scheduler, _ = await start(nursery, engine, keepalive=0.01)
    req = request("echo: one two boom")
    with trio.fail_after(10):
        events = await collect(scheduler, req)
    kinds = {type(e) for e in events}
    assert {KeepAlive, OutputTextDelta, StreamError, ResponseFinished} <= kinds
    assert {e.response_id for e in events} == {req.record.id}


async def test_store_false_is_not_stored(nursery: trio.Nursery) -> None:
    scheduler, store = await start(nursery, FakeEngine())
    req = request("echo: ephemeral", store=False)
    events = await collect(scheduler, req)
    assert isinstance(events[-1], ResponseFinished)
    assert await store.get(req.record.id) is None


async def test_queue_bound_and_slots(nursery: trio.Nursery) -> None:
    engine = FakeEngine()
    engine.hold()  # the first stream holds the slot until released
    scheduler, _ = await start(nursery, engine, parallel=1, depth=1)
    long = "echo: " + " ".join(["w"] * 50)
    first_stream = scheduler.stream(request(long))
    await first_stream.submit()
    await first_stream.__anext__()  # the slot has taken it
    second_stream = scheduler.stream(request("echo: queued"))
    await second_stream.submit()
    with pytest.raises(QueueFull):
        await scheduler.stream(request("echo: refused")).submit()
    engine.release()
    with trio.fail_after(10):
        async with first_stream, second_stream:
            first = [e async for e in first_stream]
            second = [e async for e in second_stream]
    assert isinstance(first[-1], ResponseFinished)
    assert isinstance(second[-1], ResponseFinished)
    assert second[-1].record.output_text == "queued"


async def test_requests_submitted_together_are_admitted_all_or_none(
    nursery: trio.Nursery,
) -> None:
    """Two slots and one queue place take three at once and no fourth: a batch that
    does not fit is refused whole and leaves nothing behind; one that fits exactly is
    never refused."""
    engine = FakeEngine()
    engine.hold()
    scheduler, _ = await start(nursery, engine, parallel=2, depth=1)
    long = "echo: " + " ".join(["w"] * 50)
    four = [scheduler.stream(request(long)) for _ in range(4)]
    with pytest.raises(QueueFull):
        await submit_together(four)
    stats = await scheduler.statistics()
    assert (stats.busy, stats.queued) == (0, 0)
    three = [scheduler.stream(request(long)) for _ in range(3)]
    await submit_together(three)
    stats = await scheduler.statistics()
    assert (stats.busy, stats.queued) == (2, 1)
    with pytest.raises(QueueFull):
        await scheduler.stream(request("echo: one more")).submit()
    engine.release()
    with trio.fail_after(10):
        for stream in three:
            async with stream:
                assert isinstance([e async for e in stream][-1], ResponseFinished)


async def test_leaving_requester_frees_its_slot(nursery: trio.Nursery) -> None:
    engine = FakeEngine()
    engine.hold(on="w")  # the long stream never runs to its end; the others run
    scheduler, _ = await start(nursery, engine, parallel=1, depth=0)
    long = "echo: " + " ".join(["w"] * 500)
    async with scheduler.stream(request(long, max_tokens=1000)) as events:
        await events.submit()
        async for event in events:
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
    with trio.fail_after(5):  # the model thread drops it at its next step (held, it could
        await wait_until(lambda: engine.active == 0)  # leave no other way)


async def test_a_cancel_racing_the_end_changes_nothing_twice(nursery: trio.Nursery) -> None:
    scheduler, store = await start(nursery, FakeEngine())
    req = request("echo: the end is near", conversation="conv-race")
    async with scheduler.stream(req) as events:
        await events.submit()
        seen: list[ResponseEvent] = []
        async for event in events:
            seen.append(event)
            if isinstance(event, OutputTextDone):
                break
        # The record has ended; the slot waits for us to take its closing events.
        with trio.fail_after(5):
            after = await scheduler.cancel(req.record.id)
        assert after is not None
        assert after.status == "completed"
        seen += [event async for event in events]
    assert [type(e).__name__ for e in seen[-4:]] == [
        "OutputTextDone",
        "ContentPartDone",
        "OutputItemDone",
        "ResponseFinished",
    ]
    assert sum(isinstance(e, ResponseFinished) for e in seen) == 1
    final = seen[-1]
    assert isinstance(final, ResponseFinished)
    assert final.record.status == "completed"
    stored = await store.get(req.record.id)
    assert stored is not None
    assert stored.status == "completed"
    conversation = await store.get_conversation("conv-race")
    assert conversation is not None
    assert conversation.items == final.record.output  # the turn, once


async def test_a_reader_that_stops_reading_frees_the_slot_when_its_sequence_ends(
    nursery: trio.Nursery, autojump_clock: trio.testing.MockClock
) -> None:
    """A slow or stalled reader used to hold its slot for the whole delivery (with
    `--parallel 1`, everyone else got 503 meanwhile). Its events now wait in its own
    stream: the slot finishes the response, stores it and takes the next request."""
    engine = FakeEngine()
    scheduler, store = await start(nursery, engine, parallel=1, depth=1)
    stalled = scheduler.stream(request("echo: " + " ".join(["w"] * 50)))
    await stalled.submit()
    await stalled.__anext__()  # then reads nothing more for now
    events = await collect(scheduler, request("echo: next"))
    final = events[-1]
    assert isinstance(final, ResponseFinished)
    assert final.record.output_text == "next"
    record = await store.get(stalled.response_id)
    assert record is not None
    assert record.status == "completed"
    async with stalled:  # the reader comes back: every event is there, in order
        rest = [e async for e in stalled]
    assert isinstance(rest[-1], ResponseFinished)
    assert rest[-1].record == record


async def test_once_draining_every_submission_is_refused(nursery: trio.Nursery) -> None:
    """A request whose body arrived after the drain began used to be admitted, run, and
    be cut by the backstop with no terminal event."""
    scheduler, _ = await start(nursery, FakeEngine(step_delay=0.01), parallel=1)
    running = scheduler.stream(request("echo: " + " ".join(["w"] * 20)))
    await running.submit()
    await running.__anext__()  # the slot has taken it
    drained = trio.Event()

    async def drain() -> None:
        await scheduler.drain()
        drained.set()

    nursery.start_soon(drain)
    await trio.testing.wait_all_tasks_blocked()
    for waits in (False, True):
        with pytest.raises(ShuttingDown):
            await scheduler.stream(request("echo: late"), waits=waits).submit()
    with trio.fail_after(10):
        async with running:
            events = [e async for e in running]
        await drained.wait()
    assert isinstance(events[-1], ResponseFinished)
    assert events[-1].record.status == "completed"
