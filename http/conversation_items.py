"""A conversation's items (`/v1/conversations/{id}/items`): list, add, retrieve, delete.

Added items may be `item_reference`s: an input or output item of one of the tenant's
stored responses, added under its own id (a 400 for an id not found, or one the
conversation already holds)."""

from __future__ import annotations

from quart import Blueprint, Response, request

from mlxcel.errors import NotFound
from mlxcel.http.body import read_model
from mlxcel.http.conversations import added_items, changed_conversation, existing_conversation
from mlxcel.http.handles import json_response
from mlxcel.http.objects import conversation_json, item_json
from mlxcel.http.schemas import ConversationItemsBody, list_page
from mlxcel.store import AddItems, RemoveItem

conversation_items = Blueprint("conversation_items", __name__)


@conversation_items.get("/conversations/<conversation_id>/items")
async def list_conversation_items(conversation_id: str) -> Response:
    conversation = await existing_conversation(conversation_id)
    return json_response(list_page(conversation.items, request.args, item_json))


@conversation_items.post("/conversations/<conversation_id>/items")
async def create_conversation_items(conversation_id: str) -> Response:
    conversation = await existing_conversation(conversation_id)
    body = await read_model(ConversationItemsBody)
    items = await added_items(body.items, conversation.items)
    await changed_conversation(conversation_id, AddItems(items))
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


@conversation_items.get("/conversations/<conversation_id>/items/<item_id>")
async def retrieve_conversation_item(conversation_id: str, item_id: str) -> Response:
    conversation = await existing_conversation(conversation_id)
    for item in conversation.items:
        if item.id == item_id:
            return json_response(item_json(item))
    raise NotFound(f"Item with id '{item_id[:64]}' not found.", code="not_found")


@conversation_items.delete("/conversations/<conversation_id>/items/<item_id>")
async def delete_conversation_item(conversation_id: str, item_id: str) -> Response:
    conversation = await existing_conversation(conversation_id)
    if not any(item.id == item_id for item in conversation.items):
        raise NotFound(f"Item with id '{item_id[:64]}' not found.", code="not_found")
    updated = await changed_conversation(conversation_id, RemoveItem(item_id))
    return json_response(conversation_json(updated))
