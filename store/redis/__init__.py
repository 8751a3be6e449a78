"""The Redis backend (`--store redis://...`): one store several replicas share.

`backend.py` holds the operations, each one Lua script (`scripts.py`, `job_scripts.py`,
`deliveries.py`); `values.py` turns values into script arguments and back; `upgrade.py`
brings an earlier release's keys to this layout at start."""

from mlxcel.store.redis.backend import RedisBackend

__all__ = ["RedisBackend"]
