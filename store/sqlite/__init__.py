"""The SQLite backend (`--store sqlite`): the store in one file that survives restarts.

`backend.py` holds the operations, each one transaction on the store's thread; `rows.py`
the rows they are made of; `file.py` the file's lock, layout and version; `deliveries.py`
the pending webhook deliveries; `event_log.py` the background responses' event logs, in
the same file."""

from mlxcel.store.sqlite.backend import SqliteBackend
from mlxcel.store.sqlite.event_log import SqliteEventLog

__all__ = ["SqliteBackend", "SqliteEventLog"]
