"""The SQLite backend (`--store sqlite`): the store in one file that survives restarts.

`backend.py` holds the operations, each one transaction on the store's thread; `rows.py`
the rows they are made of; `file.py` the file's lock, layout and version; `deliveries.py`
the pending webhook deliveries."""

from mlxcel.store.sqlite.backend import SqliteBackend

__all__ = ["SqliteBackend"]
