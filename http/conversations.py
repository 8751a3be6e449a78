"""The Conversations API (`/v1/conversations`), backed by the store's transcripts.

It lets clients such as the Agents SDK's `OpenAIConversationsSession` keep a transcript
on the server and pass it to `/v1/responses` as `conversation`.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from quart import Response, request

from mlxcel.actors.messages import AddItems, ConversationChange, Refused, RemoveItem, SetMetadata
from mlxcel.actors.store import StoreHandle, conversation_not_found
from mlxcel.errors import InvalidRequest, NotFound
from mlxcel.http.body import read_model
from mlxcel.http.objects import conversation_json, item_json
from mlxcel.http.schemas import (
    ConversationCreateBody,
    ConversationItemsBody,
    ConversationUpdateBody,
    list_page,
    to_items,
)
from mlxcel.items import Conversation, new_conversation_id

Route = Callable[..., Callable[[Any], Any]]
JsonResponse = Callable[..., Response]


def register_conversations(route: Route, store: StoreHandle, json_response: JsonResponse) -> None:
    """Mount the conversation routes (with and without `/v1`) through `route`."""

    def check_enabled() -> None:
        if not store.conversations_limits.enabled:
            raise InvalidRequest(
                "The conversation store is disabled on this server "
                "(--conversation-store-max-entries 0).",
                code="storage_disabled",
            )

    async def existing(conversation_id: str) -> Conversation:
        check_enabled()
        found = await store.get_conversation(conversation_id)
        if found is None:
            raise conversation_not_found(conversation_id)
        return found

    async def changed(conversation_id: str, change: ConversationChange) -> Conversation:
        """The transcript after `change`; a refused change leaves it as it was."""
        outcome = await store.change(conversation_id, change)
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

    @route("/conversations", methods=["POST"])
    async def create_conversation() -> Response:
        check_enabled()
        body = await read_model(ConversationCreateBody, empty={})
        conversation = Conversation(
            id=new_conversation_id(),
            created_at=int(time.time()),
            metadata=dict(body.metadata or {}),
            items=to_items(body.items or []),
        )
        if not await store.put_conversation(conversation):
            raise InvalidRequest(
                "The conversation is larger than the conversation store.", code="too_large"
            )
        return json_response(conversation_json(conversation))

    @route("/conversations/<conversation_id>", methods=["GET"])
    async def retrieve_conversation(conversation_id: str) -> Response:
        return json_response(conversation_json(await existing(conversation_id)))

    @route("/conversations/<conversation_id>", methods=["POST"])
    async def update_conversation(conversation_id: str) -> Response:
        await existing(conversation_id)
        body = await read_model(ConversationUpdateBody)
        updated = await changed(conversation_id, SetMetadata(dict(body.metadata)))
        return json_response(conversation_json(updated))

    @route("/conversations/<conversation_id>", methods=["DELETE"])
    async def delete_conversation(conversation_id: str) -> Response:
        await existing(conversation_id)
        await store.delete_conversation(conversation_id)
        return json_response(
            {"id": conversation_id, "object": "conversation.deleted", "deleted": True}
        )

    @route("/conversations/<conversation_id>/items", methods=["GET"])
    async def list_conversation_items(conversation_id: str) -> Response:
        conversation = await existing(conversation_id)
        items = [item_json(i) for i in conversation.items]
        return json_response(list_page(items, request.args))

    @route("/conversations/<conversation_id>/items", methods=["POST"])
    async def create_conversation_items(conversation_id: str) -> Response:
        await existing(conversation_id)
        body = await read_model(ConversationItemsBody)
        items = to_items(body.items)
        await changed(conversation_id, AddItems(items))
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

    @route("/conversations/<conversation_id>/items/<item_id>", methods=["GET"])
    async def retrieve_conversation_item(conversation_id: str, item_id: str) -> Response:
        conversation = await existing(conversation_id)
        for item in conversation.items:
            if item.id == item_id:
                return json_response(item_json(item))
        raise NotFound(f"Item with id '{item_id[:64]}' not found.", code="not_found")

    @route("/conversations/<conversation_id>/items/<item_id>", methods=["DELETE"])
    async def delete_conversation_item(conversation_id: str, item_id: str) -> Response:
        conversation = await existing(conversation_id)
        if not any(item.id == item_id for item in conversation.items):
            raise NotFound(f"Item with id '{item_id[:64]}' not found.", code="not_found")
        updated = await changed(conversation_id, RemoveItem(item_id))
        return json_response(conversation_json(updated))
