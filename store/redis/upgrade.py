"""What takes a Redis store written by an earlier release to this release's keys.

Earlier releases indexed items in one JSON list per item id (`items`, re-encoded on every
put and delete: quadratic in a record that repeats one id) and listed each response's
item ids in `responses:itemids`. This release keeps a sorted set per tenant and id
(`scripts.py`); the stored responses are indexed afresh once, at start, and the
old keys are dropped. Indexing is idempotent, so replicas starting together may each
run it. A response this release cannot read is left out of the index, never the reason a
server does not start. Earlier releases also kept every pending webhook delivery's due time in one sorted
set; this release keeps one per tenant (`deliveries.py`), and moves them once.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import Any

import coredis

import mlxcel.store.redis.scripts as lua
from mlxcel.items import ResponseRecord
from mlxcel.store.codec import CodecError, decode
from mlxcel.store.redis.deliveries import UPGRADE as UPGRADE_DELIVERIES
from mlxcel.store.redis.values import item_places
from mlxcel.store.tables import Table

log = logging.getLogger(__name__)

Run = Callable[..., Awaitable[Any]]
"""The backend's `_run`: one script with its arguments."""


async def upgrade(client: coredis.Redis[bytes], base: str, run: Run) -> None:
    """Take whatever an earlier release left to this release's keys (each step idempotent)."""
    await upgrade_item_index(client, base, run)
    moved = await run(UPGRADE_DELIVERIES)
    if moved:
        log.info("moved %d pending webhook deliveries to their tenants' keys", moved)


async def upgrade_item_index(client: coredis.Redis[bytes], base: str, run: Run) -> None:
    """Index every response the old layout indexed, then drop the old keys."""
    old = f"{base}responses:itemids"
    rids = await client.hkeys(old)
    if not rids and not await client.exists([f"{base}items"]):
        return
    log.info("indexing the items of %d stored responses afresh (a store upgrade)", len(rids))
    for rid in rids:
        body = await client.hget(f"{base}responses:body", rid)
        try:
            record = decode(body) if body is not None else None
        except CodecError as exc:
            # Kept as stored (reading it answers as any unreadable value does); only its
            # items cannot be found by reference, since no index can be made of it.
            log.warning(
                "stored response %s cannot be read (%s); its items are not indexed",
                rid.decode(errors="replace"),
                exc,
            )
            continue
        if isinstance(record, ResponseRecord):
            await run(lua.REINDEX, record.id, item_places(Table.RESPONSES, record))
    await client.delete([old, f"{base}items"])
