"""The memory backend (`--store memory`): the store in this process, gone with it."""

from mlxcel.store.memory.backend import MemoryBackend

__all__ = ["MemoryBackend"]
