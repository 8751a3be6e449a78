"""The memory backend (`--store memory`): the store in this process, gone with it.

`backend.py` holds the tables and the pinned jobs; `event_log.py` the background
responses' event logs, on the same clock."""

from mlxcel.store.memory.backend import MemoryBackend
from mlxcel.store.memory.event_log import MemoryEventLog

__all__ = ["MemoryBackend", "MemoryEventLog"]
