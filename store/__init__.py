"""What the server keeps, where, and for how long: the store actor and its handle, the
tables and their limits, the backends (memory, SQLite, Redis, a package each) and the
rules they share, the item index, the reasoning-echo table and this replica's lease on a
shared store. The store imports nothing above the vocabulary.

The front door: what the rest of the package uses from the store, by name. Each name is
loaded from its module when first asked for, so that the settings (`config.py` reads
only `store/limits.py`) load no backend, no actor and none of their dependencies.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from mlxcel.store.actor import StoreActor as StoreActor
    from mlxcel.store.actor import StoreHandle as StoreHandle
    from mlxcel.store.actor import conversation_not_found as conversation_not_found
    from mlxcel.store.backend import Charge as Charge
    from mlxcel.store.backend import JobOwner as JobOwner
    from mlxcel.store.deliveries import Added as Added
    from mlxcel.store.deliveries import Delivery as Delivery
    from mlxcel.store.echo import EchoHandle as EchoHandle
    from mlxcel.store.event_log import EventLog as EventLog
    from mlxcel.store.event_log import LogSlice as LogSlice
    from mlxcel.store.limits import StoreLimits as StoreLimits
    from mlxcel.store.tables import AddItems as AddItems
    from mlxcel.store.tables import ConversationChange as ConversationChange
    from mlxcel.store.tables import Refused as Refused
    from mlxcel.store.tables import RemoveItem as RemoveItem
    from mlxcel.store.tables import SetMetadata as SetMetadata
    from mlxcel.store.tables import StoreStatistics as StoreStatistics
    from mlxcel.store.tables import Table as Table
    from mlxcel.store.tables import TableStatistics as TableStatistics

FRONT_DOOR = {
    "StoreActor": "actor",
    "StoreHandle": "actor",
    "conversation_not_found": "actor",
    "Charge": "backend",
    "JobOwner": "backend",
    "Added": "deliveries",
    "Delivery": "deliveries",
    "EchoHandle": "echo",
    "EventLog": "event_log",
    "LogSlice": "event_log",
    "StoreLimits": "limits",
    "AddItems": "tables",
    "ConversationChange": "tables",
    "Refused": "tables",
    "RemoveItem": "tables",
    "SetMetadata": "tables",
    "StoreStatistics": "tables",
    "Table": "tables",
    "TableStatistics": "tables",
}
"""Each name of the front door and the module of the store it comes from."""


def __getattr__(name: str) -> object:
    module = FRONT_DOOR.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{module}"), name)
    globals()[name] = value  # asked for once
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *FRONT_DOOR})
