"""The SQLite store's pending webhook deliveries (`store/deliveries.py`): one row each in
a table of their own, created with the store's file when missing (an earlier file gains
it at its first open here), each operation one transaction on the store's thread."""

from __future__ import annotations

import sqlite3
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from mlxcel.store.deliveries import MAX_PENDING, Delivery, decode_delivery, encode_delivery

T = TypeVar("T")
Call = Callable[..., Awaitable[Any]]
"""The backend's `_call`: runs an operation `(now, *args)` in one transaction."""

_TABLE = """
CREATE TABLE IF NOT EXISTS webhook_deliveries (
    response_id TEXT PRIMARY KEY,
    due REAL NOT NULL,
    body TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS webhook_deliveries_due ON webhook_deliveries (due);
"""


class SqliteDeliveries:
    """`Deliveries` in the store's SQLite file."""

    def __init__(self, db: sqlite3.Connection, call: Call) -> None:
        db.executescript(_TABLE)  # at open, on the opening thread, outside any transaction
        self._db = db
        self._call = call

    async def add(self, delivery: Delivery, delay_secs: float, *, settle: bool = False) -> bool:
        result: bool = await self._call(self._add, delivery, delay_secs, settle)
        return result

    async def claim(self, limit: int, lease_secs: float) -> tuple[Delivery, ...]:
        result: tuple[Delivery, ...] = await self._call(self._claim, limit, lease_secs)
        return result

    async def drop(self, response_id: str) -> bool:
        result: bool = await self._call(self._drop, response_id)
        return result

    def _add(self, now: float, delivery: Delivery, delay_secs: float, settle: bool) -> bool:
        db = self._db
        known = db.execute(
            "SELECT 1 FROM webhook_deliveries WHERE response_id = ?", (delivery.response_id,)
        ).fetchone()
        if known is None and settle:
            return False
        if known is None:
            (count,) = db.execute("SELECT count(*) FROM webhook_deliveries").fetchone()
            if count >= MAX_PENDING:
                return False
        db.execute(
            "INSERT OR REPLACE INTO webhook_deliveries (response_id, due, body) VALUES (?, ?, ?)",
            (delivery.response_id, now + delay_secs, encode_delivery(delivery)),
        )
        return True

    def _claim(self, now: float, limit: int, lease_secs: float) -> tuple[Delivery, ...]:
        rows = self._db.execute(
            "SELECT response_id, body FROM webhook_deliveries WHERE due <= ? ORDER BY due LIMIT ?",
            (now, limit),
        ).fetchall()
        self._db.executemany(
            "UPDATE webhook_deliveries SET due = ? WHERE response_id = ?",
            [(now + lease_secs, response_id) for response_id, _ in rows],
        )
        return tuple(decode_delivery(body) for _, body in rows)

    def _drop(self, now: float, response_id: str) -> bool:
        cursor = self._db.execute(
            "DELETE FROM webhook_deliveries WHERE response_id = ?", (response_id,)
        )
        return cursor.rowcount > 0
