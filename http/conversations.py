"""The Conversations API (`/v1/conversations`), backed by the store's transcripts.

It lets clients such as the Agents SDK's `OpenAIConversationsSession` keep a transcript
on the server and pass it to `/v1/responses` as `conversation`. Items added (at creation
or later) may be `item_reference`s to the tenant's stored response items.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

from quart import Blueprint, Response

from mlxcel.errors import InvalidRequest
from mlxcel.http.body import read_model
from mlxcel.http.guards import current_tenant
from mlxcel.http.handles import handles, json_response
from mlxcel.http.item_schemas import InputItem, ItemReferenceIn, to_entries
from mlxcel.http.objects import conversation_json
from mlxcel.http.schemas import ConversationCreateBody, ConversationUpdateBody
from mlxcel.items import Conversation, Item, new_conversation_id
from mlxcel.prepare.history import resolve_items
from mlxcel.prepare.offload import off_loop
from mlxcel.store import (
    ConversationChange,
    Refused,
    SetMetadata,
    StoreHandle,
    conversation_not_found,
)

conversations = Blueprint("conversations", __name__)


def check_enabled() -> None:
    """A 400 when the conversation store is off."""
    if not _store().conversations_limits.enabled:
        raise InvalidRequest(
            "The conversation store is disabled on this server "
            "(--conversation-store-max-entries 0).",
            code="storage_disabled",
        )


async def existing_conversation(conversation_id: str) -> Conversation:
    """The conversation, or a 404."""
    check_enabled()
    found = await _store().get_conversation(conversation_id, tenant=current_tenant())
    if found is None:
        raise conversation_not_found(conversation_id)
    return found


async def changed_conversation(conversation_id: str, change: ConversationChange) -> Conversation:
    """The transcript after `change`; a refused change leaves it as it was."""
    outcome = await _store().change(conversation_id, change, tenant=current_tenant())
    if outcome is Refused.MISSING:
        raise conversation_not_found(conversation_id)
    if outcome is Refused.FULL:
        raise InvalidRequest(
            f"Conversation '{conversation_id[:64]}' is full: with this change it would "
            "exceed the conversation store's byte budget. It is unchanged; delete some "
            "of its items or start a new conversation.",
            code="conversation_full",
        )
    return outcome


@conversations.post("/conversations")
async def create_conversation() -> Response:
    check_enabled()
    body = await read_model(ConversationCreateBody, empty={})
    conversation = Conversation(
        id=new_conversation_id(),
        created_at=int(time.time()),
        metadata=dict(body.metadata or {}),
        items=await added_items(body.items or []),
    )
    if not await _store().put_conversation(conversation, tenant=current_tenant()):
        raise InvalidRequest(
            "The conversation is larger than the conversation store.", code="too_large"
        )
    return json_response(conversation_json(conversation))


@conversations.get("/conversations/<conversation_id>")
async def retrieve_conversation(conversation_id: str) -> Response:
    return json_response(conversation_json(await existing_conversation(conversation_id)))


@conversations.post("/conversations/<conversation_id>")
async def update_conversation(conversation_id: str) -> Response:
    await existing_conversation(conversation_id)
    body = await read_model(ConversationUpdateBody)
    updated = await changed_conversation(conversation_id, SetMetadata(dict(body.metadata)))
    return json_response(conversation_json(updated))


@conversations.delete("/conversations/<conversation_id>")
async def delete_conversation(conversation_id: str) -> Response:
    await existing_conversation(conversation_id)
    await _store().delete_conversation(conversation_id, tenant=current_tenant())
    return json_response({"id": conversation_id, "object": "conversation.deleted", "deleted": True})


async def added_items(
    raw: Sequence[InputItem | ItemReferenceIn], held: tuple[Item, ...] = ()
) -> tuple[Item, ...]:
    """Items to add to a conversation that holds `held`: `item_reference`s become the
    tenant's stored response items they name, each once (a 400 for an id not found, or
    one the conversation already holds)."""
    sent, references = await off_loop(to_entries, raw)
    items = await resolve_items(sent, references, _store(), current_tenant(), param="items")
    seen = {item.id for item in held}
    for reference in references:
        if reference.id in seen:
            raise InvalidRequest(
                f"Item with id '{reference.id[:64]}' is already in the conversation.",
                param=f"items[{reference.index}].id",
                code="duplicate_item",
            )
        seen.add(reference.id)
    return items


def _store() -> StoreHandle:
    return handles().store
