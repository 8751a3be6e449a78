"""The SQLite store's rows: one per stored value, their counters and their recency.

`Rows` does the row-level pieces the backend's transactions are made of (insert, remove,
evict, touch) and keeps the entry and byte counters of each table in step with them;
`Traces` is the reasoning-echo cache's table. Both run on the store's thread, inside a
transaction the backend opened.
"""

from __future__ import annotations

import contextlib
import sqlite3
from typing import Any

from mlxcel.items import ResponseRecord
from mlxcel.store.backend import JobOwner
from mlxcel.store.sqlite.file import index_items
from mlxcel.store.tables import Stored, Table


class Rows:
    """The `entries` and `items` tables of one open store file."""

    def __init__(self, db: sqlite3.Connection) -> None:
        self._db = db
        self.counts: dict[Table, list[int]] = {}
        """Each table's [entries, bytes], as committed."""
        self._tick = 0
        """The last `last_access` given: recency is a counter, not a time."""
        self.written = 0
        """Bytes of values written since the backend last read this."""
        self.recount()

    def held_size(self, response_id: str, owner: JobOwner) -> int | None:
        """The size of an unfinished job's record if `owner` holds it, else None."""
        row = self._db.execute(
            "SELECT owner, epoch, size FROM entries WHERE tbl = 'active' AND id = :id",
            {"id": response_id},
        ).fetchone()
        if row is None or (row[0], row[1]) != (owner.replica, owner.epoch):
            return None
        return int(row[2])

    def insert(
        self,
        table: Table,
        value: Stored,
        body: bytes,
        *,
        expires: float | None = None,
        owner: JobOwner | None = None,
    ) -> None:
        self._tick += 1
        prev = value.echo.previous_response_id if isinstance(value, ResponseRecord) else None
        self.written += len(body)
        self._db.execute(
            "INSERT INTO entries (tbl, id, size, expires_at, last_access, prev, owner, epoch, "
            "body) VALUES (:tbl, :id, :size, :expires, :tick, :prev, :owner, :epoch, :body)",
            {
                "tbl": table.value,
                "id": value.id,
                "size": len(body),
                "expires": expires,
                "tick": self._tick,
                "prev": prev,
                "owner": owner.replica if owner else None,
                "epoch": owner.epoch if owner else None,
                "body": body,
            },
        )
        if table is Table.RESPONSES and isinstance(value, ResponseRecord):
            index_items(self._db, value)
        self.counts[table][0] += 1
        self.counts[table][1] += len(body)

    def remove(self, table: Table, where: str, **params: Any) -> int:
        """Delete the table's rows matching `where`; how many."""
        gone = self._db.execute(
            f"DELETE FROM entries WHERE tbl = :tbl AND {where} RETURNING size",
            {"tbl": table.value, **params},
        ).fetchall()
        self.counts[table][0] -= len(gone)
        self.counts[table][1] -= sum(size for (size,) in gone)
        return len(gone)

    def purge(self, table: Table, now: float) -> None:
        self.remove(table, "expires_at <= :now", now=now)

    def evict_one(self, table: Table) -> None:
        self.remove(
            table,
            "rowid = (SELECT rowid FROM entries WHERE tbl = :tbl ORDER BY last_access LIMIT 1)",
        )

    def touch(self, table: Table, rowid: int) -> None:
        if table is not Table.ACTIVE:
            self._tick += 1
            self._db.execute(
                "UPDATE entries SET last_access = ? WHERE rowid = ?", (self._tick, rowid)
            )

    def recount(self) -> None:
        self.counts = {table: [0, 0] for table in Table}
        rows = self._db.execute(
            "SELECT tbl, count(*), coalesce(sum(size), 0) FROM entries GROUP BY tbl"
        )
        for tbl, entries, size in rows:
            with contextlib.suppress(ValueError):
                self.counts[Table(tbl)] = [entries, size]
        (tick,) = self._db.execute("SELECT coalesce(max(last_access), 0) FROM entries").fetchone()
        self._tick = max(self._tick, tick)


class Traces:
    """The `traces` table: returned reasoning by turn key, least recently used first
    out once `max_bytes` would be passed (the reasoning-echo cache)."""

    def __init__(self, db: sqlite3.Connection, max_bytes: int) -> None:
        self._db = db
        self._max_bytes = max_bytes
        self._bytes = 0
        self._tick = 0
        self.recount()

    def remember(self, now: float, key: str, reasoning: str) -> None:
        size = len(reasoning.encode())
        if size > self._max_bytes:
            return  # what was there stays
        self._forget("key = ?", (key,))
        oldest = "key = (SELECT key FROM traces ORDER BY last_access LIMIT 1)"
        while self._bytes + size > self._max_bytes and self._forget(oldest, ()):
            pass
        self._tick += 1
        self._db.execute(
            "INSERT INTO traces (key, size, last_access, reasoning) VALUES (?, ?, ?, ?)",
            (key, size, self._tick, reasoning),
        )
        self._bytes += size

    def recall(self, now: float, keys: tuple[str, ...]) -> dict[str, str]:
        found: dict[str, str] = {}
        for key in keys:
            row = self._db.execute("SELECT reasoning FROM traces WHERE key = ?", (key,)).fetchone()
            if row is not None:
                self._tick += 1
                self._db.execute(
                    "UPDATE traces SET last_access = ? WHERE key = ?", (self._tick, key)
                )
                found[key] = row[0]
        return found

    def recount(self) -> None:
        (self._bytes, tick) = self._db.execute(
            "SELECT coalesce(sum(size), 0), coalesce(max(last_access), 0) FROM traces"
        ).fetchone()
        self._tick = max(self._tick, tick)

    def _forget(self, where: str, params: tuple[str, ...]) -> int:
        """Delete the traces matching `where`; how many."""
        gone = self._db.execute(f"DELETE FROM traces WHERE {where} RETURNING size", params)
        sizes = [size for (size,) in gone.fetchall()]
        self._bytes -= sum(sizes)
        return len(sizes)
