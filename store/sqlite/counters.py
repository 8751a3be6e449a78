"""The SQLite store's rate-limit counters: one row per counter and window length (the
`counters` table, `file.py`), so every key's request and token rates survive a restart.

A window is a fixed span of `window_secs` (`store/backend.py`'s `window`); a charge in
a new window starts its count again. Runs inside the backend's transaction, on its thread.
"""

from __future__ import annotations

import sqlite3

from mlxcel.store.backend import Charge, window


def charge(
    db: sqlite3.Connection, now: float, counter: str, amount: int, limit: int, window_secs: int
) -> Charge:
    """Charge `amount` (a refund when negative) to `counter` in its current window, if
    `limit` (0: none) allows: whether it did, what is used, and when the window resets."""
    start, resets_in = window(now, window_secs)
    row = db.execute(
        "SELECT used FROM counters WHERE counter = ? AND window_secs = ? AND window_start = ?",
        (counter, window_secs, start),
    ).fetchone()
    used = int(row[0]) if row is not None else 0
    allowed = limit == 0 or used < limit
    if allowed and (amount > 0 or (amount < 0 and used > 0)):
        used = max(0, used + amount)
        db.execute(
            "INSERT INTO counters (counter, window_secs, window_start, used) "
            "VALUES (?, ?, ?, ?) ON CONFLICT (counter, window_secs) DO UPDATE SET "
            "window_start = excluded.window_start, used = excluded.used",
            (counter, window_secs, start, used),
        )
    return Charge(allowed, used, resets_in)
