"""`GET /metrics`: the server's metrics in the Prometheus text format.

The actors' state (slots, the waiting line, the store's tables) is asked for here, at
scrape time, and set just before the text is made; the counters and histograms are kept
up to date where their events happen (`mlxcel.metrics`).
"""

from __future__ import annotations

from quart import Blueprint, Response

from mlxcel.errors import StoreUnavailable
from mlxcel.http.handles import handles
from mlxcel.metrics import CONTENT_TYPE
from mlxcel.store.tables import StoreStatistics

prometheus = Blueprint("prometheus", __name__)


@prometheus.get("/metrics")
async def metrics() -> Response:
    h = handles()
    slots = await h.scheduler.statistics()
    try:
        tables: StoreStatistics | None = await h.store.statistics()
    except StoreUnavailable:
        tables = None  # a shared store is away: the server itself is still to be watched
    m = h.metrics
    # No await from here on: the text is made from these readings alone.
    m.set_scheduler(slots.slots, slots.busy, slots.queued)
    m.store_up.set(0 if tables is None else 1)
    if tables is not None:
        for name, table in (
            ("responses", tables.responses),
            ("conversations", tables.conversations),
            ("ephemeral", tables.ephemeral),
            ("active", tables.active),
        ):
            m.set_table(name, table.entries, table.bytes)
    return Response(m.exposition(), status=200, content_type=CONTENT_TYPE)
