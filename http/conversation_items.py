"""A conversation's items (`/v1/conversations/{id}/items`): list, add, retrieve, delete.

Added items may be `item_reference`s: an input or output item of one of the tenant's
stored responses, added under its own id (a 400 for an id not found, or one the
conversation already holds)."""

from __future__ import annotations

from quart import Blueprint, Response, request

from mlxcel.errors import InvalidRequest, NotFound
from mlxcel.http.body import read_model
from mlxcel.http.conversations import changed_conversation, existing_conversation
from mlxcel.http.guards import current_tenant
from mlxcel.http.handles import handles, json_response
from mlxcel.http.item_schemas import to_entries
from mlxcel.http.objects import conversation_json, item_json
from mlxcel.http.schemas import ConversationItemsBody, list_page
from mlxcel.items import Item, ItemReference
from mlxcel.prepare.history import resolve_items
from mlxcel.store.tables import AddItems, RemoveItem

conversation_items = Blueprint("conversation_items", __name__)


@conversation_items.get("/conversations/<conversation_id>/items")
async def list_conversation_items(conversation_id: str) -> Response:
    conversation = await existing_conversation(conversation_id)
    return json_response(list_page(conversation.items, request.args, item_json))


@conversation_items.post("/conversations/<conversation_id>/items")
async def create_conversation_items(conversation_id: str) -> Response:
    conversation = await existing_conversation(conversation_id)
    body = await read_model(ConversationItemsBody)
    sent, references = to_entries(body.items)
    store, tenant = handles().store, current_tenant()
    items = await resolve_items(sent, references, store, tenant, param="items")
    _check_new(conversation.items, items, references)
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


def _check_new(
    held: tuple[Item, ...], items: tuple[Item, ...], references: tuple[ItemReference, ...]
) -> None:
    """A referenced item is added once: its id names one item of the conversation."""
    seen = {item.id for item in held}
    for reference in references:
        if reference.id in seen:
            raise InvalidRequest(
                f"Item with id '{reference.id[:64]}' is already in the conversation.",
                param=f"items[{reference.index}].id",
                code="duplicate_item",
            )
        seen.add(reference.id)


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
