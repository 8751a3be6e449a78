"""The job supervisor with the scheduler, model actor and store (fake engine, no HTTP)."""

from __future__ import annotations

import dataclasses
import functools
from dataclasses import dataclass, field

import pytest
import trio
import trio.testing

from mlxcel.actors.jobs import BYTES_PER_OUTPUT_TOKEN, JobsHandle, JobSupervisor
from mlxcel.actors.scheduler import Scheduler
from mlxcel.config import Settings, StoreLimits
from mlxcel.errors import RateLimited, ShuttingDown
from mlxcel.fleet import ModelLease
from mlxcel.fleet.engines import Engines
from mlxcel.generation import GenerateText, GenerationRequest, ModelNames, Sampling
from mlxcel.items import RequestEcho, ResponseRecord, Usage, new_id
from mlxcel.model.actor import ModelActor
from mlxcel.model.fake import FakeCodec, FakeEngine, fake_factory
from mlxcel.store import StoreActor, StoreHandle, Table
from mlxcel.store.codec import encoded_size

from support import key_prefix, wait_until

DEFAULTS = Settings()


async def start(
    nursery: trio.Nursery,
    store_spec: str,
    engine: FakeEngine,
    *,
    max_jobs: int = 4,
    max_bytes: int = 1 << 20,
    ephemeral_ttl: float = 600,
) -> tuple[Jobs, StoreHandle]:
    limits = StoreLimits(100, max_bytes, 0)
    actor = StoreActor(
        limits,
        StoreLimits(10, 1 << 20, 0),
        ephemeral_ttl,
        store=store_spec,
        clock=trio.current_time,
        key_prefix=key_prefix(),
    )
    store = await nursery.start(actor.run)
    model = await nursery.start(ModelActor(functools.partial(fake_factory, engine), 1).run)
    await model.ready.wait()
    scheduler = await nursery.start(
        Scheduler(
            model,
            store,
            store.echo,
            parallel=1,
            max_queue_depth=0,
            keepalive_secs=3600,
            send_timeout_secs=DEFAULTS.send_timeout_secs,
        ).run
    )
    handle = await nursery.start(JobSupervisor(store, max_jobs=max_jobs, max_bytes=max_bytes).run)
    jobs = Jobs(handle, [])
    engines = Engines(ModelNames("m", "/models/m"), model, scheduler)
    jobs.lease = ModelLease.taken("m", engines, lambda: jobs.returned.append("m"))
    return jobs, store


@dataclass
class Jobs:
    """The supervisor's handle, each job submitted on the one model (as a route submits
    it under its request's lease, which this test holds until it ends it)."""

    handle: JobsHandle
    returned: list[str]
    """Appended to when the last share of the lease has ended."""
    lease: ModelLease = field(init=False)

    async def submit(self, request: GenerationRequest) -> ResponseRecord:
        return await self.handle.submit(request, self.lease)

    async def cancel(self, response_id: str) -> ResponseRecord | None:
        return await self.handle.cancel(response_id)

    async def end_all(self) -> None:
        await self.handle.end_all()


def job(text: str, *, store: bool = True, max_tokens: int = 50) -> GenerationRequest:
    record = ResponseRecord(
        id=new_id("resp"),
        created_at=0,
        status="in_progress",
        echo=RequestEcho(model="m"),
        store=store,
        background=True,
    )
    prompt = FakeCodec().render([{"role": "user", "content": text}], None)
    return GenerationRequest(record, tuple(prompt), Sampling(max_tokens=max_tokens))


async def statuses(store: StoreHandle, response_id: str, until: str) -> list[str]:
    """Every status the store shows for a job, polled until `until`."""
    seen: list[str] = []
    with trio.fail_after(10):
        while not seen or seen[-1] != until:
            record = await store.get(response_id)
            assert record is not None
            if not seen or seen[-1] != record.status:
                seen.append(record.status)
            await trio.sleep(0.001)
    return seen


async def test_every_transition_is_written_to_the_store(
    nursery: trio.Nursery, store_spec: str
) -> None:
    engine = FakeEngine(step_delay=0.005)
    jobs, store = await start(nursery, store_spec, engine)
    first = await jobs.submit(job("echo: " + " ".join(["w"] * 40)))
    second = await jobs.submit(job("echo: done"))
    assert (first.status, first.usage, first.output) == ("queued", Usage(), ())
    seen = await statuses(store, second.id, "completed")
    assert seen == ["queued", "in_progress", "completed"]
    final = await store.get(second.id, (Table.RESPONSES,))
    assert final is not None
    assert final.output_text == "done"
    assert await store.get(second.id, (Table.ACTIVE,)) is None  # unpinned


async def test_cap_and_bytes(nursery: trio.Nursery, store_spec: str) -> None:
    engine = FakeEngine()
    engine.hold()  # the first job stays active
    one = job("echo: " + " ".join(["w"] * 100), max_tokens=100)
    size = encoded_size(dataclasses.replace(one.record, status="queued", usage=Usage()))
    budget = size + BYTES_PER_OUTPUT_TOKEN * 100
    jobs, _ = await start(nursery, store_spec, engine, max_jobs=2, max_bytes=budget)
    await jobs.submit(one)
    with pytest.raises(RateLimited):  # the budget is full, though the cap is not
        await jobs.submit(job("echo: x", max_tokens=1))


async def test_a_job_over_the_cap_is_refused_and_nothing_is_kept(
    nursery: trio.Nursery, store_spec: str
) -> None:
    engine = FakeEngine()
    engine.hold()  # the first job stays active
    jobs, store = await start(nursery, store_spec, engine, max_jobs=1)
    first = await jobs.submit(job("echo: " + " ".join(["w"] * 100), max_tokens=100))
    refused = job("echo: x")
    with pytest.raises(RateLimited) as caught:
        await jobs.submit(refused)
    assert caught.value.code == "rate_limit_exceeded"
    assert await store.get(refused.record.id) is None
    assert await store.get(first.id) is not None
    jobs.lease.end()  # the request's own share: the first job still holds the model
    assert jobs.returned == []
    engine.release()
    with trio.fail_after(10):
        await wait_until(lambda: jobs.returned == ["m"])  # the job's share ended with it
    ended = await store.get(first.id)
    assert ended is not None
    assert ended.status == "incomplete"  # its 100 tokens spent


async def test_oversized_final_object_becomes_a_failed_one(
    nursery: trio.Nursery, store_spec: str
) -> None:
    request = job("echo: " + " ".join(["abcdefghijklmnop"] * 60), max_tokens=60)
    queued_size = encoded_size(dataclasses.replace(request.record, status="queued", usage=Usage()))
    # Room to admit the job, but not for its 60 long words of output plus their item.
    budget = queued_size + BYTES_PER_OUTPUT_TOKEN * 60
    jobs, store = await start(nursery, store_spec, FakeEngine(), max_bytes=budget)
    queued = await jobs.submit(request)
    await statuses(store, queued.id, "failed")
    final = await store.get(queued.id)
    assert final is not None
    assert final.output == ()
    assert final.error is not None
    assert final.error.code == "server_error"


async def test_ephemeral_result_expires_on_the_fake_clock(
    nursery: trio.Nursery, store_spec: str, mock_clock: trio.testing.MockClock
) -> None:
    mock_clock.rate = 1.0  # real time passes (the model thread is real); jumps add to it
    jobs, store = await start(nursery, store_spec, FakeEngine(), ephemeral_ttl=30)
    queued = await jobs.submit(job("echo: short lived", store=False))
    await statuses(store, queued.id, "completed")
    assert await store.get(queued.id, (Table.RESPONSES,)) is None
    mock_clock.jump(25)
    assert await store.get(queued.id) is not None
    mock_clock.jump(6)
    assert await store.get(queued.id) is None


async def test_cancel_at_each_stage(nursery: trio.Nursery, store_spec: str) -> None:
    engine = FakeEngine()
    engine.hold(on="w")  # the running job runs until cancelled; the others run
    jobs, store = await start(nursery, store_spec, engine)
    running = await jobs.submit(job("echo: " + " ".join(["w"] * 200), max_tokens=200))
    queued = await jobs.submit(job("echo: queued"))
    with trio.fail_after(5):
        await wait_until(lambda: engine.held > 2)
    for target in (queued, running):
        final = await jobs.cancel(target.id)
        assert final is not None
        assert final.status == "cancelled"
        stored = await store.get(target.id)
        assert stored == final
    done = await jobs.submit(job("echo: end"))
    await statuses(store, done.id, "completed")
    assert await jobs.cancel(done.id) is None  # not active any more
    assert (await store.statistics()).active.entries == 0


async def test_a_prelude_that_raises_fails_that_job_alone(
    nursery: trio.Nursery, store_spec: str
) -> None:
    jobs, store = await start(nursery, store_spec, FakeEngine())

    async def broken(generate: GenerateText) -> GenerationRequest:
        raise RuntimeError("a bug in compacting")

    failing = await jobs.submit(dataclasses.replace(job("echo: never"), prelude=broken))
    await statuses(store, failing.id, "failed")  # and never completed
    record = await store.get(failing.id)
    assert record is not None
    assert record.error is not None
    assert record.error.code == "server_error"
    # The supervisor carries on.
    fine = await jobs.submit(job("echo: fine"))
    await statuses(store, fine.id, "completed")


async def test_ending_all_jobs_fails_running_and_queued_ones(
    nursery: trio.Nursery, store_spec: str
) -> None:
    engine = FakeEngine()
    engine.hold()  # the running job runs until the end
    jobs, store = await start(nursery, store_spec, engine)
    running = await jobs.submit(job("echo: " + " ".join(["w"] * 40)))
    queued = await jobs.submit(job("echo: queued"))
    with trio.fail_after(10):
        await wait_until(lambda: engine.active == 1)
        await jobs.end_all()
    for record_id in (running.id, queued.id):
        record = await store.get(record_id)
        assert record is not None
        assert record.status == "failed"
        assert record.error is not None
        assert "shut down" in record.error.message
    with pytest.raises(ShuttingDown):  # nothing new is admitted once they are ended
        await jobs.submit(job("echo: late"))
