"""Where each stored response's items live, so an `item_reference` finds its item by id.

The index belongs to the store actor's response table and follows it: a record put is
indexed, a record deleted, evicted or expired is forgotten, so it holds no more than the
table does. One id can live in several records (a turn resent, a referenced item stored
again as input); a lookup takes the newest that is still stored.
"""

from __future__ import annotations

from mlxcel.items import Item, ResponseRecord


class ItemIndex:
    """Item id → (response id, place among its input items then its output)."""

    def __init__(self) -> None:
        self._places: dict[str, list[tuple[str, int]]] = {}
        self._ids: dict[str, tuple[str, ...]] = {}

    def add(self, record: ResponseRecord) -> None:
        self.remove(record.id)
        ids: list[str] = []
        for place, item in enumerate((*record.input_items, *record.output)):
            if item.id is not None:
                self._places.setdefault(item.id, []).append((record.id, place))
                ids.append(item.id)
        self._ids[record.id] = tuple(ids)

    def remove(self, response_id: str) -> None:
        for item_id in self._ids.pop(response_id, ()):
            places = self._places.get(item_id, [])
            places[:] = [p for p in places if p[0] != response_id]
            if not places:
                self._places.pop(item_id, None)

    def places(self, item_id: str) -> list[tuple[str, int]]:
        """Where the item lives, newest first."""
        return list(reversed(self._places.get(item_id, [])))

    def __len__(self) -> int:
        return len(self._places)


def item_at(record: ResponseRecord, place: int) -> Item | None:
    """The item at `place` among the record's input items then its output."""
    inputs = len(record.input_items)
    if place < inputs:
        return record.input_items[place]
    return record.output[place - inputs] if place - inputs < len(record.output) else None
