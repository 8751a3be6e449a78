"""The background responses' event logs on every backend (memory, SQLite, Redis): frames
come back as appended, numbering is checked on append, and the bounds hold (the event
cap, the byte budget that drops the longest-ended logs first, the retention)."""

from __future__ import annotations

import trio

from mlxcel.config import Settings, StoreLimits
from mlxcel.items import RequestEcho, ResponseRecord
from mlxcel.store.actor import StoreActor, StoreHandle
from mlxcel.store.event_log import EventLimits, EventLog
from mlxcel.store.memory import MemoryEventLog
from mlxcel.store.tables import Table, TableStatistics

from support import key_prefix

DEFAULTS = Settings()
OFF = StoreLimits(0, 0, 0)


async def open_events(
    nursery: trio.Nursery, store_spec: str, *, max_events: int = 100, max_bytes: int = 1000
) -> EventLog:
    actor = StoreActor(
        StoreLimits(100, max_bytes, 60),
        OFF,
        DEFAULTS.background_ephemeral_ttl_secs,
        store=store_spec,
        key_prefix=key_prefix(),
        max_events_per_response=max_events,
    )
    handle: StoreHandle = await nursery.start(actor.run)
    assert handle.events is not None
    return handle.events


def frame(n: int, size: int = 10) -> bytes:
    return f"f{n}".encode().ljust(size, b".")


async def test_frames_come_back_in_order_and_numbers_are_checked(
    nursery: trio.Nursery, store_spec: str
) -> None:
    events = await open_events(nursery, store_spec)
    assert await events.read("resp_a", -1, 10) is None
    assert not await events.append("resp_a", 1, (frame(1),), end_ttl=None)  # not first
    assert await events.append("resp_a", 0, (frame(0), frame(1)), end_ttl=None)
    assert not await events.append("resp_a", 1, (frame(9),), end_ttl=None)  # numbered twice
    assert await events.append("resp_a", 2, (frame(2),), end_ttl=0)
    assert not await events.append("resp_a", 3, (frame(3),), end_ttl=None)  # ended
    found = await events.read("resp_a", -1, 10)
    assert found is not None
    assert found.frames == (frame(0), frame(1), frame(2))
    assert (found.count, found.ended, found.truncated) == (3, True, False)
    tail = await events.read("resp_a", 1, 10)
    assert tail is not None
    assert tail.frames == (frame(2),)
    limited = await events.read("resp_a", -1, 2)
    assert limited is not None
    assert limited.frames == (frame(0), frame(1))


async def test_a_log_past_the_event_cap_is_truncated_and_others_stay_whole(
    nursery: trio.Nursery, store_spec: str
) -> None:
    events = await open_events(nursery, store_spec, max_events=3)
    assert await events.append("resp_a", 0, (frame(0), frame(1), frame(2)), end_ttl=None)
    assert not await events.append("resp_a", 3, (frame(3),), end_ttl=None)
    assert await events.append("resp_b", 0, (frame(0),), end_ttl=None)
    assert not await events.append("resp_a", 4, (frame(4),), end_ttl=0)  # ends, kept nothing
    cut = await events.read("resp_a", -1, 10)
    assert cut is not None
    assert (cut.frames, cut.count, cut.ended, cut.truncated) == ((), 5, True, True)
    whole = await events.read("resp_b", -1, 10)
    assert whole is not None
    assert whole.frames == (frame(0),)


async def test_the_byte_budget_drops_the_longest_ended_logs_never_a_running_one(
    nursery: trio.Nursery, store_spec: str
) -> None:
    events = await open_events(nursery, store_spec, max_bytes=100)
    assert await events.append("resp_old", 0, (frame(0, 40),), end_ttl=0)
    assert await events.append("resp_new", 0, (frame(0, 40),), end_ttl=0)
    assert await events.append("resp_run", 0, (frame(0, 40),), end_ttl=None)  # drops old
    assert await events.read("resp_old", -1, 10) is None
    assert await events.read("resp_new", -1, 10) is not None
    assert await events.append("resp_run", 1, (frame(1, 30),), end_ttl=None)  # drops new
    assert await events.read("resp_new", -1, 10) is None
    assert await events.append("resp_two", 0, (frame(0, 30),), end_ttl=None)
    # Nothing ended is left to drop: the log that does not fit is the one cut short.
    assert not await events.append("resp_two", 1, (frame(1, 30),), end_ttl=None)
    run = await events.read("resp_run", -1, 10)
    assert run is not None
    assert run.frames == (frame(0, 40), frame(1, 30))
    two = await events.read("resp_two", -1, 10)
    assert two is not None
    assert two.truncated
    assert await events.append("resp_three", 0, (frame(0, 30),), end_ttl=None)  # its room


async def test_an_ended_log_is_kept_as_long_as_its_response() -> None:
    clock = [0.0]
    events = MemoryEventLog(EventLimits(10, 1000, 5, 1), lambda: clock[0], lambda *_: False)
    stored = ResponseRecord(
        id="resp_s", created_at=0, status="completed", echo=RequestEcho(model="m")
    )
    assert events.limits.ttl_for(stored) == 5
    ephemeral = ResponseRecord(
        id="resp_e", created_at=0, status="completed", echo=RequestEcho(model="m"), store=False
    )
    assert events.limits.ttl_for(ephemeral) == 1
    assert await events.append("resp_s", 0, (frame(0),), end_ttl=5)
    assert await events.append("resp_r", 0, (frame(0),), end_ttl=None)
    clock[0] = 4.9
    assert await events.read("resp_s", -1, 10) is not None
    clock[0] = 5.0
    assert await events.read("resp_s", -1, 10) is None
    assert await events.read("resp_r", -1, 10) is not None  # a running log never expires


async def test_a_reader_waiting_on_a_log_wakes_when_it_grows(
    nursery: trio.Nursery, store_spec: str
) -> None:
    events = await open_events(nursery, store_spec)
    assert await events.append("resp_w", 0, (frame(0),), end_ttl=None)
    woke = trio.Event()

    async def reader() -> None:
        await events.wait("resp_w", 0)
        woke.set()

    nursery.start_soon(reader)
    await trio.sleep(0.1)
    assert not woke.is_set()
    assert await events.append("resp_w", 1, (frame(1),), end_ttl=None)
    with trio.fail_after(2):
        await woke.wait()


async def test_statistics_count_the_logs_and_their_frames_bytes(
    nursery: trio.Nursery, store_spec: str
) -> None:
    events = await open_events(nursery, store_spec, max_events=3)
    assert await events.statistics() == TableStatistics(entries=0, bytes=0)
    assert await events.append("resp_a", 0, (frame(0), frame(1)), end_ttl=None)
    assert await events.append("resp_b", 0, (frame(0, 30),), end_ttl=0)
    assert await events.statistics() == TableStatistics(entries=2, bytes=50)
    assert not await events.append("resp_a", 2, (frame(2), frame(3)), end_ttl=None)  # cut
    assert await events.statistics() == TableStatistics(entries=2, bytes=30)


async def test_a_deleted_response_takes_its_log_and_a_late_end_brings_none_back(
    nursery: trio.Nursery, store_spec: str
) -> None:
    actor = StoreActor(
        StoreLimits(100, 100_000, 60),
        OFF,
        DEFAULTS.background_ephemeral_ttl_secs,
        store=store_spec,
        key_prefix=key_prefix(),
        max_events_per_response=100,
    )
    store: StoreHandle = await nursery.start(actor.run)
    events = store.events
    assert events is not None
    for response_id, keep in (("resp_gone", True), ("resp_kept", True), ("resp_eph", False)):
        echo = RequestEcho(model="m")
        record = ResponseRecord(
            id=response_id,
            created_at=0,
            status="completed",
            echo=echo,
            store=keep,
            background=True,
        )
        table = Table.RESPONSES if keep else Table.EPHEMERAL
        assert await store.put(record, table)
        assert await events.append(response_id, 0, (frame(0), frame(1)), end_ttl=None)
    assert await store.delete_response("resp_gone")
    assert await store.get("resp_gone") is None
    assert await events.read("resp_gone", -1, 10) is None
    # The job's terminal frame, appended after its end was stored, starts no log again.
    assert not await events.append("resp_gone", 2, (frame(2),), end_ttl=0)
    assert await events.read("resp_gone", -1, 10) is None
    assert not await store.delete_response("resp_gone")
    assert await store.delete_response("resp_eph")  # a `store: false` result's too
    assert await events.read("resp_eph", -1, 10) is None
    kept = await events.read("resp_kept", -1, 10)
    assert kept is not None
    assert kept.frames == (frame(0), frame(1))
    assert await events.statistics() == TableStatistics(entries=1, bytes=20)
