"""The Conversations API (`/v1/conversations`), backed by the store's transcripts.

It lets clients such as the Agents SDK's `OpenAIConversationsSession` keep a transcript
on the server and pass it to `/v1/responses` as `conversation`.
"""

from __future__ import annotations

import time

from quart import Blueprint, Response, request

from mlxcel.actors.messages import AddItems, ConversationChange, Refused, RemoveItem, SetMetadata
from mlxcel.actors.store import StoreHandle, conversation_not_found
from mlxcel.errors import InvalidRequest, NotFound
from mlxcel.http.body import read_model
from mlxcel.http.handles import handles, json_response
from mlxcel.http.objects import conversation_json, item_json
from mlxcel.http.schemas import (
    ConversationCreateBody,
    ConversationItemsBody,
    ConversationUpdateBody,
    list_page,
    to_items,
)
from mlxcel.items import Conversation, new_conversation_id

conversations = Blueprint("conversations", __name__)


def _check_enabled() -> None:
    if not _store().conversations_limits.enabled:
        raise InvalidRequest(
            "The conversation store is disabled on this server "
            "(--conversation-store-max-entries 0).",
            code="storage_disabled",
        )


async def _existing(conversation_id: str) -> Conversation:
    _check_enabled()
    found = await _store().get_conversation(conversation_id)
    if found is None:
        raise conversation_not_found(conversation_id)
    return found


async def _changed(conversation_id: str, change: ConversationChange) -> Conversation:
    """The transcript after `change`; a refused change leaves it as it was."""
    outcome = await _store().change(conversation_id, change)
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
    _check_enabled()
    body = await read_model(ConversationCreateBody, empty={})
    conversation = Conversation(
        id=new_conversation_id(),
        created_at=int(time.time()),
        metadata=dict(body.metadata or {}),
        items=to_items(body.items or []),
    )
    if not await _store().put_conversation(conversation):
        raise InvalidRequest(
            "The conversation is larger than the conversation _store().", code="too_large"
        )
    return json_response(conversation_json(conversation))


@conversations.get("/conversations/<conversation_id>")
async def retrieve_conversation(conversation_id: str) -> Response:
    return json_response(conversation_json(await _existing(conversation_id)))


@conversations.post("/conversations/<conversation_id>")
async def update_conversation(conversation_id: str) -> Response:
    await _existing(conversation_id)
    body = await read_model(ConversationUpdateBody)
    updated = await _changed(conversation_id, SetMetadata(dict(body.metadata)))
    return json_response(conversation_json(updated))


@conversations.delete("/conversations/<conversation_id>")
async def delete_conversation(conversation_id: str) -> Response:
    await _existing(conversation_id)
    await _store().delete_conversation(conversation_id)
    return json_response({"id": conversation_id, "object": "conversation.deleted", "deleted": True})


@conversations.get("/conversations/<conversation_id>/items")
async def list_conversation_items(conversation_id: str) -> Response:
    conversation = await _existing(conversation_id)
    items = [item_json(i) for i in conversation.items]
    return json_response(list_page(items, request.args))


@conversations.post("/conversations/<conversation_id>/items")
async def create_conversation_items(conversation_id: str) -> Response:
    await _existing(conversation_id)
    body = await read_model(ConversationItemsBody)
    items = to_items(body.items)
    await _changed(conversation_id, AddItems(items))
    data = [item_json(i) for i in items]
    return json_response(
        {
            "object": "list",
            "data": data,
            "first_id": data[0]["id"],
            "last_id": data[-1]["id"],
            "has_more": False,
        }
    )


@conversations.get("/conversations/<conversation_id>/items/<item_id>")
async def retrieve_conversation_item(conversation_id: str, item_id: str) -> Response:
    conversation = await _existing(conversation_id)
    for item in conversation.items:
        if item.id == item_id:
            return json_response(item_json(item))
    raise NotFound(f"Item with id '{item_id[:64]}' not found.", code="not_found")


@conversations.delete("/conversations/<conversation_id>/items/<item_id>")
async def delete_conversation_item(conversation_id: str, item_id: str) -> Response:
    conversation = await _existing(conversation_id)
    if not any(item.id == item_id for item in conversation.items):
        raise NotFound(f"Item with id '{item_id[:64]}' not found.", code="not_found")
    updated = await _changed(conversation_id, RemoveItem(item_id))
    return json_response(conversation_json(updated))


def _store() -> StoreHandle:
    return handles().store
