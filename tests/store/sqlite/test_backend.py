"""What only the SQLite backend does: survive being closed and opened again, keep one
server per file, end the jobs an earlier process left, refuse a file it cannot read."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from mlxcel.errors import ConfigError
from mlxcel.items import Conversation, InputText, Message, RequestEcho, ResponseRecord
from mlxcel.store.backend import RESTART_MESSAGE, JobOwner
from mlxcel.store.limits import StoreLimits
from mlxcel.store.sqlite import SqliteBackend
from mlxcel.store.sqlite.file import SCHEMA_VERSION
from mlxcel.store.tables import AddItems, Table

LIMITS = StoreLimits(100, 1 << 20, 0)


class Clock:
    """A clock the test moves by hand (wall-clock seconds, as a restart sees them)."""

    def __init__(self) -> None:
        self.now = 1_000_000.0

    def __call__(self) -> float:
        return self.now


def record(
    rid: str, *, prev: str | None = None, store: bool = True, status: str = "completed"
) -> ResponseRecord:
    return ResponseRecord(
        id=rid,
        created_at=0,
        status=status,  # type: ignore[arg-type]
        echo=RequestEcho(model="m", previous_response_id=prev),
        output=(Message("assistant", (InputText(f"said {rid}"),), id=f"msg_{rid}"),),
        store=store,
        background=True,
    )


async def open_store(
    path: Path, clock: Clock, responses: StoreLimits = LIMITS, ephemeral: StoreLimits = LIMITS
) -> SqliteBackend:
    return await SqliteBackend.open(path, responses, LIMITS, ephemeral, clock=clock)


async def test_what_was_stored_is_there_after_reopening(tmp_path: Path) -> None:
    path, clock = tmp_path / "store.sqlite3", Clock()
    store = await open_store(path, clock)
    for n in range(5):
        assert await store.put(Table.RESPONSES, record(f"r{n}", prev=f"r{n - 1}" if n else None))
    said = Message("user", (InputText("hello"),), id="msg_u")
    assert await store.change_conversation("conv_a", AddItems((said,), "r0"), True)
    before = await store.statistics()
    await store.aclose()

    store = await open_store(path, clock)
    assert await store.get((Table.RESPONSES,), "r3") == record("r3", prev="r2")
    chain = await store.get_chain("r4")
    assert [r.id for r in chain.records] == ["r4", "r3", "r2", "r1", "r0"]
    assert chain.missing is None
    conversation = await store.get((Table.CONVERSATIONS,), "conv_a")
    assert isinstance(conversation, Conversation)
    assert conversation.items == (said,)
    found = await store.find_items(frozenset({"msg_r2", "msg_nowhere"}))
    assert list(found) == ["msg_r2"]
    assert await store.statistics() == before
    await store.aclose()


async def test_expiry_follows_the_injected_clock_across_a_reopen(tmp_path: Path) -> None:
    path, clock = tmp_path / "store.sqlite3", Clock()
    store = await open_store(path, clock, responses=StoreLimits(100, 1 << 20, 2))
    await store.put(Table.RESPONSES, record("short"))
    await store.aclose()
    clock.now += 3
    store = await open_store(path, clock, responses=StoreLimits(100, 1 << 20, 2))
    assert await store.get((Table.RESPONSES,), "short") is None
    assert (await store.statistics()).responses.entries == 0
    await store.aclose()


async def test_a_chain_stops_where_an_id_is_missing(tmp_path: Path) -> None:
    store = await open_store(tmp_path / "store.sqlite3", Clock())
    await store.put(Table.RESPONSES, record("b", prev="a"))
    await store.put(Table.RESPONSES, record("c", prev="b"))
    chain = await store.get_chain("c")
    assert [r.id for r in chain.records] == ["c", "b"]
    assert chain.missing == "a"
    assert (await store.get_chain("nothing")).missing == "nothing"
    await store.aclose()


async def test_a_second_opener_of_the_file_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "store.sqlite3"
    first = await open_store(path, Clock())
    with pytest.raises(ConfigError, match="in use by another mlxcel server"):
        await open_store(path, Clock())
    await first.aclose()
    second = await open_store(path, Clock())  # the lock went with the first's close
    await second.aclose()


async def test_jobs_of_an_earlier_process_end_failed_and_a_stale_owner_is_fenced_out(
    tmp_path: Path,
) -> None:
    path, clock = tmp_path / "store.sqlite3", Clock()
    old = JobOwner("host:1", "epoch-1")
    store = await open_store(path, clock)
    await store.register_job(record("queued", status="queued"), old)
    await store.register_job(record("running", status="queued", store=False), old)
    assert await store.update_job(record("running", status="in_progress", store=False), old)
    assert await store.request_cancel("nothing") is None
    await store.aclose()  # the process "dies" with both unfinished

    new = JobOwner("host:2", "epoch-2")
    store = await open_store(path, clock)
    assert await store.reap(new) == 2
    assert await store.reap(new) == 0  # idempotent
    queued = await store.get((Table.ACTIVE, Table.RESPONSES, Table.EPHEMERAL), "queued")
    running = await store.get((Table.ACTIVE, Table.RESPONSES, Table.EPHEMERAL), "running")
    for ended in (queued, running):
        assert isinstance(ended, ResponseRecord)
        assert ended.status == "failed"
        assert ended.error is not None
        assert ended.error.code == "server_error"
        assert ended.error.message == RESTART_MESSAGE
    assert await store.get((Table.EPHEMERAL,), "running") is not None  # store: false
    # The old owner's late writes change nothing.
    assert not await store.update_job(record("queued", status="in_progress"), old)
    assert await store.finish_job(record("queued"), old) is None
    assert (await store.statistics()).active.entries == 0
    await store.aclose()


async def test_a_cancel_asked_before_the_owner_died_ends_cancelled(tmp_path: Path) -> None:
    path, clock = tmp_path / "store.sqlite3", Clock()
    old = JobOwner("host:1", "epoch-1")
    store = await open_store(path, clock)
    await store.register_job(record("job", status="in_progress"), old)
    assert await store.request_cancel("job") == old
    await store.reap(JobOwner("host:2", "epoch-2"))
    ended = await store.get((Table.RESPONSES,), "job")
    assert isinstance(ended, ResponseRecord)
    assert ended.status == "cancelled"
    await store.aclose()


async def test_counters_equal_the_sum_of_the_stored_sizes(tmp_path: Path) -> None:
    path, clock = tmp_path / "store.sqlite3", Clock()
    store = await open_store(path, clock, responses=StoreLimits(3, 1 << 20, 5))
    for n in range(10):
        await store.put(Table.RESPONSES, record(f"r{n}"))
        clock.now += 1
    await store.delete(Table.RESPONSES, "r9")
    stats = await store.statistics()
    await store.aclose()
    with sqlite3.connect(path) as db:
        rows = db.execute(
            "SELECT count(*), sum(size), sum(length(body)) FROM entries WHERE tbl = 'responses'"
        ).fetchone()
        assert db.execute("PRAGMA integrity_check").fetchone() == ("ok",)
    assert (stats.responses.entries, stats.responses.bytes) == (rows[0], rows[1])
    assert rows[1] == rows[2]
    assert stats.responses.entries == 2  # the cap kept 3; one was deleted


async def test_a_file_from_a_newer_release_or_not_a_store_is_refused(tmp_path: Path) -> None:
    newer = tmp_path / "newer.sqlite3"
    with sqlite3.connect(newer) as db:
        db.execute(f"PRAGMA user_version = {SCHEMA_VERSION + 1}")
    with pytest.raises(ConfigError, match="newer mlxcel"):
        await open_store(newer, Clock())
    garbage = tmp_path / "garbage.sqlite3"
    garbage.write_bytes(b"not a database at all" * 100)
    with pytest.raises(ConfigError, match="cannot be opened"):
        await open_store(garbage, Clock())
    # A refused file leaves its lock free.
    with pytest.raises(ConfigError, match="cannot be opened"):
        await open_store(garbage, Clock())


async def test_reasoning_traces_outlive_a_reopen_within_their_budget(tmp_path: Path) -> None:
    path, clock = tmp_path / "store.sqlite3", Clock()
    store = await SqliteBackend.open(path, LIMITS, LIMITS, LIMITS, echo_bytes=20, clock=clock)
    await store.remember("a", "0123456789")
    await store.remember("b", "0123456789")
    await store.aclose()
    store = await SqliteBackend.open(path, LIMITS, LIMITS, LIMITS, echo_bytes=20, clock=clock)
    assert await store.recall(("a", "b", "c")) == {"a": "0123456789", "b": "0123456789"}
    await store.recall(("a",))  # now b is the least recently used
    await store.remember("c", "xyz")  # the reopened budget still counts a and b
    assert set(await store.recall(("a", "b", "c"))) == {"a", "c"}
    await store.remember("a", "x" * 21)  # larger than the budget: what was there stays
    assert await store.recall(("a",)) == {"a": "0123456789"}
    await store.aclose()


async def test_the_store_files_and_a_new_folder_are_the_owners_alone(tmp_path: Path) -> None:
    folder = tmp_path / "new"
    store = await open_store(folder / "store.sqlite3", Clock())
    try:
        assert await store.put(Table.RESPONSES, record("resp_a"))
        files = sorted(folder.iterdir())
        assert {f.name for f in files} >= {
            "store.sqlite3",
            "store.sqlite3-wal",
            "store.sqlite3.lock",
        }
        for file in files:
            assert file.stat().st_mode & 0o777 == 0o600, file.name
        assert folder.stat().st_mode & 0o777 == 0o700
    finally:
        await store.aclose()


async def test_an_older_world_readable_store_file_is_made_private(tmp_path: Path) -> None:
    path = tmp_path / "store.sqlite3"
    store = await open_store(path, Clock())
    await store.aclose()
    path.chmod(0o644)
    store = await open_store(path, Clock())
    try:
        assert path.stat().st_mode & 0o777 == 0o600
    finally:
        await store.aclose()


async def test_a_version_2_file_is_indexed_afresh_per_tenant(tmp_path: Path) -> None:
    path = tmp_path / "store.sqlite3"
    store = await open_store(path, Clock())
    assert await store.put(Table.RESPONSES, record("resp_a"))
    await store.aclose()
    with sqlite3.connect(path) as db:  # the layout version 2 had: no tenant, no dedup
        db.executescript(
            "DROP TABLE items; CREATE TABLE items (seq INTEGER PRIMARY KEY AUTOINCREMENT, "
            "item_id TEXT NOT NULL, response_id TEXT NOT NULL, place INTEGER NOT NULL); "
            "PRAGMA user_version = 2;"
        )
    store = await open_store(path, Clock())
    try:
        found = await store.find_items(frozenset({"msg_resp_a"}))
        assert list(found) == ["msg_resp_a"]
        assert await store.find_items(frozenset({"msg_resp_a"}), "another") == {}
    finally:
        await store.aclose()
    with sqlite3.connect(path) as db:
        assert db.execute("PRAGMA user_version").fetchone() == (SCHEMA_VERSION,)
