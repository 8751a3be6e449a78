"""The bounds of one store table: the store's own type, which the settings fill in.

Imports nothing of the package, so `mlxcel.config` can use it without pulling in the
actors, the model or the HTTP layer.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class StoreLimits:
    """Bounds of one store (responses or conversations); see the spec's Store flags."""

    max_entries: int
    max_bytes: int
    ttl_secs: float

    @property
    def enabled(self) -> bool:
        return self.max_entries > 0
