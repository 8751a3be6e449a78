"""The SQLite store's file: its lock, its layout and its version.

A server holds `<file>.lock` exclusively for its whole life, so no second server opens the
same file (it would end the first one's jobs as a dead process's). The layout is
versioned with `PRAGMA user_version`: an older file is brought up to date when opened (each
version's additions run in turn), and a file from a newer release is refused rather than
misread.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import sqlite3
from collections.abc import Iterator
from pathlib import Path

import trio

from mlxcel.errors import ConfigError
from mlxcel.items import ResponseRecord
from mlxcel.store.codec import decode
from mlxcel.store.item_index import item_places

log = logging.getLogger(__name__)

BUSY_TIMEOUT_SECS = 2.0
"""How long an operation waits while another program (a backup, an `sqlite3` shell) holds
the file's write lock before it fails as the store being unavailable: every other store
call waits behind it meanwhile."""

CHECKPOINT_BYTES = 4 * 1024 * 1024
"""The write-ahead log is copied into the file once about this much was written (SQLite's
own default: a thousand pages)."""

PAGE_BYTES = 4096
"""What one operation counts towards `CHECKPOINT_BYTES` besides the values it writes."""

WAL_SIZE_LIMIT = 64 * 1024 * 1024
"""The write-ahead log file is cut back to this many bytes once it has been copied."""

SCHEMA_VERSION = 3
"""`PRAGMA user_version` of the layout below; a file from a newer release is refused."""

_SCHEMA = """
CREATE TABLE entries (
    tbl TEXT NOT NULL,
    id TEXT NOT NULL,
    size INTEGER NOT NULL,
    expires_at REAL,
    last_access INTEGER NOT NULL,
    prev TEXT,
    owner TEXT,
    epoch TEXT,
    cancel_requested INTEGER NOT NULL DEFAULT 0,
    body BLOB NOT NULL,
    PRIMARY KEY (tbl, id)
);
CREATE INDEX entries_lru ON entries (tbl, last_access, size);
CREATE INDEX entries_expiry ON entries (tbl, expires_at) WHERE expires_at IS NOT NULL;
CREATE TABLE items (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    item_id TEXT NOT NULL,
    response_id TEXT NOT NULL,
    place INTEGER NOT NULL
);
CREATE INDEX items_by_id ON items (item_id, seq);
CREATE INDEX items_by_response ON items (response_id);
CREATE TRIGGER entries_gone AFTER DELETE ON entries WHEN old.tbl = 'responses'
BEGIN
    DELETE FROM items WHERE response_id = old.id;
END;
CREATE TABLE traces (
    key TEXT PRIMARY KEY,
    size INTEGER NOT NULL,
    last_access INTEGER NOT NULL,
    reasoning TEXT NOT NULL
);
CREATE INDEX traces_lru ON traces (last_access);
"""
"""One row per stored value (`body` is its encoding, last so scans of the other columns
never read it); `items` says where each stored response's items live, for
`item_reference`, and follows `entries` through the trigger; `traces` is the
reasoning-echo cache."""

_COUNTERS = """
CREATE TABLE counters (
    counter TEXT NOT NULL,
    window_secs INTEGER NOT NULL,
    window_start INTEGER NOT NULL,
    used INTEGER NOT NULL,
    PRIMARY KEY (counter, window_secs)
);
"""
"""Version 2: the rate-limit counters, one row per counter and window length, holding
the count of its latest window (`StoreBackend.charge`)."""

_ITEMS_BY_TENANT = """
DROP TABLE items;
CREATE TABLE items (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    tenant TEXT NOT NULL,
    item_id TEXT NOT NULL,
    response_id TEXT NOT NULL,
    place INTEGER NOT NULL
);
CREATE INDEX items_by_id ON items (tenant, item_id, seq);
CREATE INDEX items_by_response ON items (response_id);
"""
"""Version 3: items indexed per tenant, each (response, id) once; the stored responses
are indexed again as the upgrade's last step (`index_items`)."""

_UPGRADES = (_SCHEMA, _COUNTERS, _ITEMS_BY_TENANT)
"""What takes a file from version n to version n + 1 (from 0: a new file)."""

INSERT_ITEM = "INSERT INTO items (tenant, item_id, response_id, place) VALUES (?, ?, ?, ?)"


def index_items(db: sqlite3.Connection, record: ResponseRecord) -> None:
    """Index the stored response's items: each of its ids once, under its tenant."""
    places = item_places(record)
    rows = ((record.tenant, item_id, record.id, place) for item_id, place in places.items())
    db.executemany(INSERT_ITEM, rows)


def _index_stored_responses(db: sqlite3.Connection) -> None:
    for (body,) in db.execute("SELECT body FROM entries WHERE tbl = 'responses'").fetchall():
        record = decode(body)
        if isinstance(record, ResponseRecord):
            index_items(db, record)


LIVE = "(expires_at IS NULL OR expires_at > :now)"
"""An entry not yet expired at `:now`."""

CHAIN = f"""
WITH RECURSIVE chain(depth, id, found) AS (
    SELECT 0, :id, (SELECT rowid FROM entries
        WHERE id = :id AND tbl IN ('active', 'responses') AND {LIVE}
        ORDER BY tbl = 'active' DESC LIMIT 1)
    UNION ALL
    SELECT chain.depth + 1, e.prev, (SELECT rowid FROM entries
        WHERE id = e.prev AND tbl IN ('active', 'responses') AND {LIVE}
        ORDER BY tbl = 'active' DESC LIMIT 1)
    FROM chain JOIN entries e ON e.rowid = chain.found
    WHERE e.prev IS NOT NULL AND chain.depth + 1 < :hops
)
SELECT chain.id, e.rowid, e.tbl, e.body
FROM chain LEFT JOIN entries e ON e.rowid = chain.found
ORDER BY chain.depth
"""
"""A `previous_response_id` walk from `:id` in one query, newest first: each hop's row
(an unfinished job before a stored response), or no row where the walk stopped."""

ITEM_PLACES = f"""
SELECT e.rowid, i.place FROM items i
JOIN entries e ON e.tbl = 'responses' AND e.id = i.response_id AND {LIVE}
WHERE i.tenant = :tenant AND i.item_id = :item ORDER BY i.seq DESC
"""
"""Where the tenant's live stored responses hold item `:item`, newest first."""


def lock_file(path: Path) -> int:
    """Hold `<file>.lock` exclusively for this process's life; ConfigError if another
    server has it."""
    lock_path = path.with_name(path.name + ".lock")
    try:
        # Stored responses are the users' conversations: the folder this makes and the
        # files are the owner's alone.
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        fd = os.open(lock_path, os.O_RDWR | os.O_CREAT, 0o600)
    except OSError as exc:
        raise ConfigError(f"the store {path} cannot be opened: {exc.strerror or exc}") from exc
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "unknown"
        os.close(fd)
        raise ConfigError(
            f"the store {path} is in use by another mlxcel server (pid {holder}); "
            "stop it, or give this server its own file with --store sqlite:PATH"
        ) from None
    os.ftruncate(fd, 0)
    os.pwrite(fd, str(os.getpid()).encode(), 0)
    return fd


def private_files(path: Path) -> None:
    """The store file created 0600 before SQLite opens it (its log and shared-memory
    files take the file's mode), and an older store's files made 0600 too."""
    os.close(os.open(path, os.O_RDWR | os.O_CREAT, 0o600))
    for name in (path, path.with_name(path.name + "-wal"), path.with_name(path.name + "-shm")):
        with contextlib.suppress(FileNotFoundError):
            os.chmod(name, 0o600)


def connect(path: Path) -> sqlite3.Connection:
    try:
        private_files(path)
    except OSError as exc:
        raise ConfigError(f"the store {path} cannot be opened: {exc.strerror or exc}") from exc
    try:
        db = sqlite3.connect(
            path, timeout=BUSY_TIMEOUT_SECS, isolation_level=None, check_same_thread=False
        )
        with _closing_on_error(db):
            db.execute("PRAGMA journal_mode = WAL")
            db.execute("PRAGMA synchronous = NORMAL")
            # Writes never copy the log into the file themselves (that stalls one write
            # in a hundred on an fsync): `checkpointer` does it beside them.
            db.execute("PRAGMA wal_autocheckpoint = 0")
            db.execute(f"PRAGMA journal_size_limit = {WAL_SIZE_LIMIT}")
            (version,) = db.execute("PRAGMA user_version").fetchone()
            if version > SCHEMA_VERSION:
                raise ConfigError(
                    f"the store {path} was written by a newer mlxcel (schema {version}; "
                    f"this release reads {SCHEMA_VERSION})"
                )
            if version < SCHEMA_VERSION:
                steps = " ".join(_UPGRADES[version:])
                db.executescript(f"BEGIN; {steps}")  # one transaction to the COMMIT below
                _index_stored_responses(db)
                db.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")
                db.execute("COMMIT")
        return db
    except sqlite3.DatabaseError as exc:
        raise ConfigError(f"the store {path} cannot be opened: {exc}") from exc


class Checkpointer:
    """Copies the store's write-ahead log into its file on a second connection, in its own
    thread, once about `CHECKPOINT_BYTES` were written: the store's writes go on meanwhile
    (a passive checkpoint waits for nothing), and none of them waits for an fsync."""

    def __init__(self, path: Path) -> None:
        try:
            self._db = sqlite3.connect(
                path, timeout=BUSY_TIMEOUT_SECS, isolation_level=None, check_same_thread=False
            )
        except sqlite3.DatabaseError as exc:
            raise ConfigError(f"the store {path} cannot be opened: {exc}") from exc
        self._limiter = trio.CapacityLimiter(1)
        self._due = trio.Event()
        self._written = 0
        self._closed = False

    def wrote(self, size: int) -> None:
        """Count `size` more bytes written to the log (call it from the Trio thread)."""
        self._written += size
        if self._written >= CHECKPOINT_BYTES:
            self._written = 0
            self._due.set()

    async def run_when_due(self) -> None:
        """Wait until enough was written, then checkpoint; a failure is logged."""
        await self._due.wait()
        self._due = trio.Event()

        def checkpoint() -> None:
            if not self._closed:
                self._db.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchall()

        try:
            await trio.to_thread.run_sync(checkpoint, limiter=self._limiter)
        except sqlite3.Error as exc:
            log.warning("the store's log could not be copied into its file: %s", exc)

    async def aclose(self) -> None:
        """Close the connection once a checkpoint under way is over."""
        async with self._limiter:
            self._closed = True
            self._db.close()


@contextlib.contextmanager
def _closing_on_error(db: sqlite3.Connection) -> Iterator[None]:
    try:
        yield
    except BaseException:
        db.close()
        raise
