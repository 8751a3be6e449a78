"""How the Redis store's values become script arguments and come back: table limits,
`previous_response_id` links, item places, job owners, and stored bodies read back (a
damaged one is `StoreUnavailable`, never a half-built record)."""

from __future__ import annotations

import json
import logging

from mlxcel.errors import StoreUnavailable
from mlxcel.items import ResponseRecord
from mlxcel.store.backend import JobOwner
from mlxcel.store.codec import CodecError, decode
from mlxcel.store.limits import StoreLimits
from mlxcel.store.tables import Stored, Table

log = logging.getLogger(__name__)


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
    """The item ids of a stored response and their places, for `find_items`."""
    if table is not Table.RESPONSES or not isinstance(value, ResponseRecord):
        return "[]"
    places = [
        [item.id, place]
        for place, item in enumerate((*value.input_items, *value.output))
        if item.id is not None
    ]
    return json.dumps(places)


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
    record = decode_stored(body)
    if not isinstance(record, ResponseRecord):
        log.error("the Redis store holds a %s where a response was", type(record).__name__)
        raise unavailable("not a response")
    return record
