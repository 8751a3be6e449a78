"""The event logs in the SQLite file: a table of frames beside the store's entries.

Each operation is one transaction on the store's thread (`SqliteBackend.transact`), so a
finished response's log survives a restart with it. The tables hold only logs (nothing
else refers to them) and are created when missing, whatever the file's version. One
server holds the file, so the jobs that append run in this process: a doorbell here
wakes the readers, and the logs a stopped process left unended are ended when the file
is opened (their jobs are reaped there too). A deleted response's log goes in the
transaction that deletes the response.
"""

from __future__ import annotations

import sqlite3
from typing import Any

import trio

from mlxcel.store.event_log import Doorbell, EventLimits, LogSlice
from mlxcel.store.sqlite.backend import SqliteBackend
from mlxcel.store.tables import Table, TableStatistics

TABLES = """
CREATE TABLE IF NOT EXISTS event_logs (
    response_id TEXT PRIMARY KEY,
    count INTEGER NOT NULL,
    size INTEGER NOT NULL,
    ended_at REAL,
    expires_at REAL,
    truncated INTEGER NOT NULL DEFAULT 0
);
CREATE INDEX IF NOT EXISTS event_logs_ended ON event_logs (ended_at) WHERE ended_at IS NOT NULL;
CREATE INDEX IF NOT EXISTS event_logs_expiry ON event_logs (expires_at)
    WHERE expires_at IS NOT NULL;
CREATE TABLE IF NOT EXISTS event_frames (
    response_id TEXT NOT NULL,
    seq INTEGER NOT NULL,
    frame BLOB NOT NULL,
    PRIMARY KEY (response_id, seq)
) WITHOUT ROWID;
"""


class SqliteEventLog:
    """`EventLog` in the store's SQLite file."""

    def __init__(self, backend: SqliteBackend, limits: EventLimits) -> None:
        self._backend = backend
        self.limits = limits
        self._bell = Doorbell()
        self._running: dict[str, int] = {}
        """The count of each log appended to here and not yet ended."""
        self._ready = False

    async def append(
        self, response_id: str, first: int, frames: tuple[bytes, ...], *, end_ttl: float | None
    ) -> bool:
        await self._open()
        kept: bool | None = await self._backend.transact(
            self._append, response_id, first, frames, end_ttl
        )
        if kept is not None:
            if end_ttl is None:
                self._running[response_id] = first + len(frames)
            else:
                self._running.pop(response_id, None)
            self._bell.ring(response_id)
        return bool(kept)

    async def read(self, response_id: str, after: int, limit: int) -> LogSlice | None:
        await self._open()
        found: LogSlice | None = await self._backend.transact(self._read, response_id, after, limit)
        return found

    async def wait(self, response_id: str, after: int) -> None:
        count = self._running.get(response_id)
        if count is None or count > after + 1:
            await trio.lowlevel.checkpoint()  # ended, not written here, or already longer
            return
        await self._bell.wait(response_id)

    async def statistics(self) -> TableStatistics:
        await self._open()
        found: TableStatistics = await self._backend.transact(self._statistics)
        return found

    async def delete_response(self, response_id: str, tables: tuple[Table, ...]) -> bool:
        await self._open()
        found: bool = await self._backend.transact(self._delete_response, response_id, tables)
        self._running.pop(response_id, None)
        self._bell.ring(response_id)  # a follower reads again and finds it gone
        return found

    async def _open(self) -> None:
        if not self._ready:
            await self._backend.transact(self._create)
            self._ready = True

    # --- on the store's thread, in a transaction ---------------------------------------

    def _create(self, now: float, db: sqlite3.Connection) -> None:
        for statement in TABLES.split(";"):
            if statement.strip():
                db.execute(statement)
        # Their writers are gone (one server per file), and their jobs were ended at this
        # open: a reader ends each log with its job's object; all go within the TTL.
        ttl = max(self.limits.ttl_secs, self.limits.ephemeral_ttl_secs)
        db.execute(
            "UPDATE event_logs SET expires_at = ? WHERE ended_at IS NULL",
            (now + ttl if self.limits.ttl_secs > 0 else None,),
        )

    def _append(
        self,
        now: float,
        db: sqlite3.Connection,
        response_id: str,
        first: int,
        frames: tuple[bytes, ...],
        end_ttl: float | None,
    ) -> bool | None:
        self._expire(db, now)
        row = db.execute(
            "SELECT count, ended_at, truncated FROM event_logs WHERE response_id = ?",
            (response_id,),
        ).fetchone()
        if row is None and first == 0:
            db.execute(
                "INSERT INTO event_logs (response_id, count, size) VALUES (?, 0, 0)", (response_id,)
            )
            row = (0, None, 0)
        if row is None or row[1] is not None or row[0] != first:
            return None
        count = first + len(frames)
        kept = not row[2] and self._keep(db, response_id, first, frames, count)
        ended, expires = None, None
        if end_ttl is not None:
            ended, expires = now, (now + end_ttl if end_ttl > 0 else None)
        db.execute(
            "UPDATE event_logs SET count = ?, ended_at = ?, expires_at = ? WHERE response_id = ?",
            (count, ended, expires, response_id),
        )
        return kept

    def _keep(
        self,
        db: sqlite3.Connection,
        response_id: str,
        first: int,
        frames: tuple[bytes, ...],
        count: int,
    ) -> bool:
        size = sum(len(f) for f in frames)
        while _total(db) + size > self.limits.max_bytes:
            oldest = db.execute(
                "SELECT response_id FROM event_logs WHERE ended_at IS NOT NULL "
                "ORDER BY ended_at LIMIT 1"
            ).fetchone()
            if oldest is None:
                break
            _drop(db, oldest[0])
        if count > self.limits.max_events or _total(db) + size > self.limits.max_bytes:
            db.execute("DELETE FROM event_frames WHERE response_id = ?", (response_id,))
            db.execute(
                "UPDATE event_logs SET size = 0, truncated = 1 WHERE response_id = ?",
                (response_id,),
            )
            return False
        db.executemany(
            "INSERT INTO event_frames (response_id, seq, frame) VALUES (?, ?, ?)",
            [(response_id, first + i, frame) for i, frame in enumerate(frames)],
        )
        db.execute(
            "UPDATE event_logs SET size = size + ? WHERE response_id = ?", (size, response_id)
        )
        return True

    def _delete_response(
        self, now: float, db: sqlite3.Connection, response_id: str, tables: tuple[Table, ...]
    ) -> bool:
        found = [self._backend.remove(now, table, response_id) for table in tables]
        _drop(db, response_id)
        return any(found)

    @staticmethod
    def _read(
        now: float, db: sqlite3.Connection, response_id: str, after: int, limit: int
    ) -> LogSlice | None:
        row = db.execute(
            "SELECT count, ended_at, truncated FROM event_logs WHERE response_id = :id "
            "AND (expires_at IS NULL OR expires_at > :now)",
            {"id": response_id, "now": now},
        ).fetchone()
        if row is None:
            return None
        frames = db.execute(
            "SELECT frame FROM event_frames WHERE response_id = ? AND seq > ? ORDER BY seq LIMIT ?",
            (response_id, after, limit),
        ).fetchall()
        return LogSlice(
            tuple(bytes(f) for (f,) in frames), row[0], row[1] is not None, bool(row[2])
        )

    @classmethod
    def _statistics(cls, now: float, db: sqlite3.Connection) -> TableStatistics:
        cls._expire(db, now)
        (logs,) = db.execute("SELECT count(*) FROM event_logs").fetchone()
        return TableStatistics(entries=int(logs), bytes=_total(db))

    @staticmethod
    def _expire(db: sqlite3.Connection, now: float) -> None:
        gone = db.execute("SELECT response_id FROM event_logs WHERE expires_at <= ?", (now,))
        for (response_id,) in gone.fetchall():
            _drop(db, response_id)


def _total(db: sqlite3.Connection) -> int:
    (total,) = db.execute("SELECT coalesce(sum(size), 0) FROM event_logs").fetchone()
    return int(total)


def _drop(db: sqlite3.Connection, response_id: Any) -> None:
    db.execute("DELETE FROM event_frames WHERE response_id = ?", (response_id,))
    db.execute("DELETE FROM event_logs WHERE response_id = ?", (response_id,))
