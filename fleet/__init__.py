"""Several models in one server: the registry of configured models and their states
(`registry.py`), each loaded model's engines (`engines.py`), a request's one lease on
its model (`lease.py`), and what spans every loaded model's scheduler (`router.py`).

The front door is `Fleet.open_model(name)`: an async context manager yielding the
`ModelLease` a request holds to its end and submits through.
"""

from mlxcel.fleet.engines import ConfiguredModel, EngineSpec
from mlxcel.fleet.lease import ModelLease
from mlxcel.fleet.registry import Fleet
from mlxcel.fleet.router import FleetScheduler

__all__ = ["ConfiguredModel", "EngineSpec", "Fleet", "FleetScheduler", "ModelLease"]
