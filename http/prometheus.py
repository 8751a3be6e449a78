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
from mlxcel.store import StoreStatistics, TableStatistics

prometheus = Blueprint("prometheus", __name__)


@prometheus.get("/metrics")
async def metrics() -> Response:
    h = handles()
    slots = await h.scheduler.statistics()
    events: TableStatistics | None = None
    try:
        tables: StoreStatistics | None = await h.store.statistics()
        if h.store.events is not None:
            events = await h.store.events.statistics()
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
    if tables is not None and events is not None:
        m.set_table("events", events.entries, events.bytes)  # background responses' logs
    return Response(m.exposition(), status=200, content_type=CONTENT_TYPE)
