"""Where each stored response's items live, so an `item_reference` finds its item by id.

The index belongs to the store's response table and follows it: a record put is indexed,
a record deleted, evicted or expired is forgotten, so it holds no more than the table
does. Ids are the client's, so they are indexed per tenant: another tenant's record that
holds the same id is never found, never touched, and never tells that the id was used.
One id can live in several of a tenant's records (a turn resent, a referenced item stored
again as input); a lookup takes the newest that is still stored.

Each (record, id) is indexed once, however often the record repeats the id: putting,
deleting and evicting a record costs time linear in its size whatever ids it carries.
"""

from __future__ import annotations

from mlxcel.items import Item, ResponseRecord

ItemKey = tuple[str, str]
"""(tenant, item id)."""


def item_places(record: ResponseRecord) -> dict[str, int]:
    """Each item id of the record, once, with its place among the record's input items
    then its output (a repeated id: its last place, the one a lookup always found)."""
    places: dict[str, int] = {}
    for place, item in enumerate((*record.input_items, *record.output)):
        if item.id is not None:
            places[item.id] = place
    return places


class ItemIndex:
    """(tenant, item id) → the response ids holding it, oldest first, with the item's
    place in each."""

    def __init__(self) -> None:
        self._holders: dict[ItemKey, dict[str, int]] = {}
        self._keys: dict[str, tuple[ItemKey, ...]] = {}

    def add(self, record: ResponseRecord) -> None:
        self.remove(record.id)
        places = item_places(record)
        keys = tuple((record.tenant, item_id) for item_id in places)
        for key, place in zip(keys, places.values(), strict=True):
            self._holders.setdefault(key, {})[record.id] = place
        self._keys[record.id] = keys

    def remove(self, response_id: str) -> None:
        for key in self._keys.pop(response_id, ()):
            holders = self._holders.get(key)
            if holders is not None:
                holders.pop(response_id, None)
                if not holders:
                    del self._holders[key]

    def places(self, tenant: str, item_id: str) -> list[tuple[str, int]]:
        """Where the tenant's item lives, newest first."""
        return list(reversed(self._holders.get((tenant, item_id), {}).items()))

    def __len__(self) -> int:
        return len(self._holders)


def item_at(record: ResponseRecord, place: int) -> Item | None:
    """The item at `place` among the record's input items then its output."""
    inputs = len(record.input_items)
    if place < inputs:
        return record.input_items[place]
    return record.output[place - inputs] if place - inputs < len(record.output) else None
