"""The SQLite store's pending webhook deliveries (`store/deliveries.py`): one row each in
a table of their own, created with the store's file when missing (an earlier file gains
it at its first open here, and a table without the tenant column gains it, read from
each row's body), each operation one transaction on the store's thread."""

from __future__ import annotations

import sqlite3
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, TypeVar

from mlxcel.store.deliveries import (
    MAX_PENDING,
    Added,
    Delivery,
    UnreadableDeliveries,
    decode_delivery,
    encode_delivery,
    room_of,
)

T = TypeVar("T")
Call = Callable[..., Awaitable[Any]]
"""The backend's `_call`: runs an operation `(now, *args)` in one transaction."""

_TABLE = """
CREATE TABLE IF NOT EXISTS webhook_deliveries (
    response_id TEXT PRIMARY KEY,
    due REAL NOT NULL,
    body TEXT NOT NULL,
    tenant TEXT NOT NULL DEFAULT ''
);
"""
_INDEXES = """
CREATE INDEX IF NOT EXISTS webhook_deliveries_due ON webhook_deliveries (due);
CREATE INDEX IF NOT EXISTS webhook_deliveries_tenant ON webhook_deliveries (tenant, due);
"""


class SqliteDeliveries:
    """`Deliveries` in the store's SQLite file."""

    def __init__(self, db: sqlite3.Connection, call: Call) -> None:
        # At open, on the opening thread, outside any transaction.
        db.executescript(_TABLE)
        _add_tenants(db)
        db.executescript(_INDEXES)
        self._db = db
        self._call = call
        self._unreadable = UnreadableDeliveries()

    async def add(
        self,
        delivery: Delivery,
        delay_secs: float,
        *,
        settle: bool = False,
        unknown_only: bool = False,
        share: int | None = None,
    ) -> Added:
        result: Added = await self._call(
            self._add, delivery, delay_secs, settle, unknown_only, share
        )
        return result

    async def claim(
        self,
        limit: int,
        lease_secs: float,
        *,
        each: int | None = None,
        rooms: Mapping[str, int] | None = None,
    ) -> tuple[Delivery, ...]:
        result: tuple[Delivery, ...] = await self._call(
            self._claim, limit, lease_secs, each, dict(rooms or {})
        )
        return result

    async def drop(self, response_id: str) -> bool:
        result: bool = await self._call(self._drop, response_id)
        return result

    def _add(
        self,
        now: float,
        delivery: Delivery,
        delay_secs: float,
        settle: bool,
        unknown_only: bool,
        share: int | None,
    ) -> Added:
        db = self._db
        kept = db.execute(
            "SELECT body FROM webhook_deliveries WHERE response_id = ?", (delivery.response_id,)
        ).fetchone()
        if kept is not None and unknown_only and decode_delivery(kept[0]).status is not None:
            return Added.KNOWN
        if kept is None:
            if settle:
                return Added.GONE
            (count,) = db.execute("SELECT count(*) FROM webhook_deliveries").fetchone()
            if count >= MAX_PENDING:
                return Added.FULL
            if share is not None:
                (own,) = db.execute(
                    "SELECT count(*) FROM webhook_deliveries WHERE tenant = ?",
                    (delivery.tenant,),
                ).fetchone()
                if own >= share:
                    return Added.TENANT_FULL
        db.execute(
            "INSERT OR REPLACE INTO webhook_deliveries (response_id, due, body, tenant) "
            "VALUES (?, ?, ?, ?)",
            (delivery.response_id, now + delay_secs, encode_delivery(delivery), delivery.tenant),
        )
        return Added.KEPT

    def _claim(
        self,
        now: float,
        limit: int,
        lease_secs: float,
        each: int | None,
        rooms: dict[str, int],
    ) -> tuple[Delivery, ...]:
        db = self._db
        tenants = db.execute(
            "SELECT tenant FROM webhook_deliveries WHERE due <= ? GROUP BY tenant "
            "ORDER BY min(due), tenant",
            (now,),
        ).fetchall()
        taken: list[tuple[str, str]] = []
        for (tenant,) in tenants:
            room = room_of(tenant, each, rooms)
            left = limit - len(taken)
            most = left if room is None else min(room, left)
            if most <= 0:
                continue
            taken += db.execute(
                "SELECT response_id, body FROM webhook_deliveries "
                "WHERE tenant = ? AND due <= ? ORDER BY due, response_id LIMIT ?",
                (tenant, now, most),
            ).fetchall()
        db.executemany(
            "UPDATE webhook_deliveries SET due = ? WHERE response_id = ?",
            [(now + lease_secs, response_id) for response_id, _ in taken],
        )
        return self._unreadable.readable(taken)

    def _drop(self, now: float, response_id: str) -> bool:
        cursor = self._db.execute(
            "DELETE FROM webhook_deliveries WHERE response_id = ?", (response_id,)
        )
        return cursor.rowcount > 0


def _add_tenants(db: sqlite3.Connection) -> None:
    """Give a table an earlier release made its tenant column, read from each body."""
    columns = {row[1] for row in db.execute("PRAGMA table_info(webhook_deliveries)")}
    if "tenant" in columns:
        return
    db.execute("BEGIN IMMEDIATE")
    try:
        rows = db.execute("SELECT response_id, body FROM webhook_deliveries").fetchall()
        db.execute("ALTER TABLE webhook_deliveries ADD COLUMN tenant TEXT NOT NULL DEFAULT ''")
        db.executemany(
            "UPDATE webhook_deliveries SET tenant = ? WHERE response_id = ?",
            [(_tenant_of(body), response_id) for response_id, body in rows],
        )
        db.execute("COMMIT")
    except BaseException:
        db.execute("ROLLBACK")
        raise


def _tenant_of(body: str) -> str:
    """The tenant of a stored body; '' for one this release cannot read (its claim logs
    it, as it would have before)."""
    try:
        return decode_delivery(body).tenant
    except ValueError:
        return ""
