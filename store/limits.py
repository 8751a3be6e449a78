"""The bounds of one store table: the store's own type, which the settings fill in.

Imports nothing of the package, so `mlxcel.config` can use it without pulling in the
actors, the model or the HTTP layer.
"""

from __future__ import annotations

import urllib.parse
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True, slots=True)
class StoreLimits:
    """Bounds of one store (responses or conversations); see the spec's Store flags."""

    max_entries: int
    max_bytes: int
    ttl_secs: float

    @property
    def enabled(self) -> bool:
        return self.max_entries > 0


STORE_FILE = "store.sqlite3"
"""The SQLite file's name in the user data directory when `--store sqlite` names none."""


def sqlite_path(store: str) -> Path | None:
    """The SQLite file `--store` names (`sqlite` or `sqlite:PATH`); None for `memory` and
    a Redis URL.

    ValueError for anything else."""
    if redis_url(store) is not None:
        return None
    kind, _, path = store.partition(":")
    if kind == "memory" and not path:
        return None
    if kind == "sqlite" and (path == ":memory:" or path.startswith("file:")):
        # SQLite's in-memory or URI names would be a store that is not durable, behind a
        # flag that promises it is (and a stray `:memory:.lock` file).
        raise ValueError(
            f"--store {store!r} is not a file: use --store memory for a store in memory"
        )
    if kind != "sqlite":
        raise ValueError(
            "--store must be 'memory', 'sqlite', 'sqlite:PATH' or a redis:// or rediss:// "
            f"URL, not {store!r}"
        )
    if path:
        return Path(path).expanduser()
    import platformdirs

    return platformdirs.user_data_path("mlxcel") / STORE_FILE


def redis_url(store: str) -> str | None:
    """The Redis server `--store` names (`redis://HOST:PORT/DB` or `rediss://...`);
    None for any other kind of store. ValueError for a Redis URL with no host."""
    scheme, sep, rest = store.partition("://")
    if not sep or scheme not in ("redis", "rediss"):
        return None
    shown = f"{scheme}://{rest.rpartition('@')[2]}"  # never the password
    try:
        parts = urllib.parse.urlsplit(store)
        parts.port  # noqa: B018 (raises ValueError for a port that is no port)
    except ValueError:
        raise ValueError(f"--store {shown!r} is not a Redis URL (host, port)") from None
    if not parts.hostname:
        raise ValueError(f"--store {shown!r} names no Redis host")
    database = parts.path.strip("/")
    if database and not (database.isascii() and database.isdigit()):
        raise ValueError(f"--store {shown!r}: the database after the host is a number")
    return store
