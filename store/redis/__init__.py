"""The Redis backend (`--store redis://...`): one store several replicas share.

`backend.py` holds the operations, each one Lua script (`scripts.py`, `job_scripts.py`,
`deliveries.py`); `values.py` turns values into script arguments and back; `upgrade.py`
brings an earlier release's keys to this layout at start; `event_log.py` keeps the
background responses' event logs as Redis Streams, which any replica reads."""

from mlxcel.store.redis.backend import RedisBackend
from mlxcel.store.redis.event_log import RedisEventLog

__all__ = ["RedisBackend", "RedisEventLog"]
