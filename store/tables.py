"""What the store keeps: its tables, the values stored in them, the changes a conversation
takes, and the statistics each table reports. Every backend and every caller of the store
speaks these; they stand on nothing but the items."""

from __future__ import annotations

import enum
from dataclasses import dataclass

from mlxcel.items import Conversation, Item, ResponseRecord


class Table(enum.Enum):
    RESPONSES = "responses"
    """Stored responses: entry cap, byte budget, TTL, LRU."""
    CONVERSATIONS = "conversations"
    """Conversation transcripts: their own cap, budget and TTL."""
    EPHEMERAL = "ephemeral"
    """Final objects of `background, store: false` jobs, pollable for a short TTL."""
    ACTIVE = "active"
    """Unfinished background jobs: never evicted; the job cap bounds them."""


Stored = ResponseRecord | Conversation


@dataclass(frozen=True, slots=True)
class AddItems:
    items: tuple[Item, ...]
    response_id: str | None = None
    """The response whose turn these items are: appending its turn again changes nothing."""


@dataclass(frozen=True, slots=True)
class RemoveItem:
    item_id: str


@dataclass(frozen=True, slots=True)
class SetMetadata:
    metadata: dict[str, str]


ConversationChange = AddItems | RemoveItem | SetMetadata


class Refused(enum.Enum):
    """Why a conversation change was not made; the stored transcript is as it was."""

    MISSING = "missing"
    """No such conversation, and it was not to be created (or its id was minted here, so
    it was deleted or has expired and must not come back empty)."""
    FULL = "full"
    """The changed transcript would not fit the conversation store's byte budget."""


@dataclass(frozen=True, slots=True)
class TableStatistics:
    entries: int
    bytes: int


@dataclass(frozen=True, slots=True)
class StoreStatistics:
    responses: TableStatistics
    conversations: TableStatistics
    ephemeral: TableStatistics
    active: TableStatistics
