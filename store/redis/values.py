"""How the Redis store's values become script arguments and come back: table limits,
`previous_response_id` links, item places, job owners, and stored bodies read back (a
damaged one is `StoreUnavailable`, never a half-built record); and which failures of a
call to Redis mean the store is unavailable."""

from __future__ import annotations

import json
import logging

import anyio
from coredis.exceptions import RedisError

from mlxcel.errors import StoreUnavailable
from mlxcel.items import Item, ResponseRecord
from mlxcel.store.backend import JobOwner
from mlxcel.store.codec import CodecError, decode, decode_record
from mlxcel.store.item_index import item_at
from mlxcel.store.item_index import item_places as index_places
from mlxcel.store.limits import StoreLimits
from mlxcel.store.tables import Stored, Table

log = logging.getLogger(__name__)

FAILURES = (
    RedisError,
    OSError,
    anyio.BrokenResourceError,
    anyio.ClosedResourceError,
    anyio.EndOfStream,
    CodecError,
)
"""What a call to Redis raises when the store cannot be reached, fails, or answers what
cannot be read: each is `unavailable` (503) to a client, and a failed start-up."""


def unavailable(reason: str) -> StoreUnavailable:
    del reason  # logged where it happened; the client gets the same answer whatever it was
    return StoreUnavailable(
        "The response store could not be read or written; retry later.",
        code="store_unavailable",
    )


def limits_args(limits: StoreLimits) -> tuple[str, str, str]:
    return str(limits.max_entries), str(limits.max_bytes), repr(float(limits.ttl_secs))


def link(value: Stored) -> str:
    if isinstance(value, ResponseRecord):
        return value.echo.previous_response_id or ""
    return ""


def item_places(table: Table, value: Stored) -> str:
    """A stored response's items for the index: each id once, under its tenant, with its
    place (see `scripts.py`)."""
    if table is not Table.RESPONSES or not isinstance(value, ResponseRecord):
        return "[]"
    places = index_places(value)
    return json.dumps([[f"{value.tenant}\n{item}", str(place)] for item, place in places.items()])


def owner_arg(owner: JobOwner) -> str:
    return f"{owner.replica}\n{owner.epoch}"


def parse_owner(raw: bytes) -> JobOwner:
    replica, _, epoch = raw.decode().partition("\n")
    return JobOwner(replica, epoch)


def decode_stored(body: bytes) -> Stored:
    """A stored value read back; StoreUnavailable when it cannot be (a damaged entry)."""
    try:
        return decode(body)
    except CodecError as exc:
        log.error("the Redis store holds an unreadable entry: %s", exc)
        raise unavailable(str(exc)) from exc


def decode_response(body: bytes) -> ResponseRecord:
    """A stored response read back; StoreUnavailable when it cannot be."""
    try:
        return decode_record(body)
    except CodecError as exc:
        log.error("the Redis store holds an unreadable entry: %s", exc)
        raise unavailable(str(exc)) from exc


def found_items(flat: list[bytes]) -> dict[str, Item]:
    """`FIND_ITEMS`' answer read back: each holding record decoded once, however many of
    the request's references it holds."""
    found: dict[str, Item] = {}
    records: dict[bytes, ResponseRecord] = {}
    for n in range(0, len(flat), 4):
        item_id, rid, place, body = flat[n].decode(), flat[n + 1], int(flat[n + 2]), flat[n + 3]
        if rid not in records:
            records[rid] = decode_response(body)
        item = item_at(records[rid], place)
        if item is not None and item.id == item_id:
            found[item_id] = item
    return found
