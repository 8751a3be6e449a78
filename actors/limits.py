"""The bounds of one store table: the store's own type, which the settings fill in.

Imports nothing of the package, so `mlxcel.config` can use it without pulling in the
actors, the model or the HTTP layer.
"""

from __future__ import annotations

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
    """The SQLite file `--store` names (`sqlite` or `sqlite:PATH`); None for `memory`.

    ValueError for anything else."""
    kind, _, path = store.partition(":")
    if kind == "memory" and not path:
        return None
    if kind != "sqlite":
        raise ValueError(f"--store must be 'memory', 'sqlite' or 'sqlite:PATH', not {store!r}")
    if path:
        return Path(path).expanduser()
    import platformdirs

    return platformdirs.user_data_path("mlxcel") / STORE_FILE
