"""The turns a request continues: a stored response chain (`previous_response_id`), a
conversation, and the stored items its `item_reference`s name.

Each is the tenant's own: another tenant's responses and conversations are not found.
"""

from __future__ import annotations

import dataclasses
import re
from typing import Protocol

from mlxcel.errors import InvalidRequest
from mlxcel.items import (
    Compaction,
    FunctionCall,
    FunctionCallOutput,
    Item,
    ItemReference,
    JsonValue,
)
from mlxcel.prepare.params import ResponseParams
from mlxcel.store import StoreHandle

ID_PATTERN = re.compile(r"[A-Za-z0-9_.:-]{1,128}")


def conversation_id(value: str | dict[str, JsonValue] | None) -> str | None:
    """The id a request's `conversation` names (`"conv_x"` or `{"id": "conv_x"}`)."""
    if value is None:
        return None
    raw = value.get("id") if isinstance(value, dict) else value
    if not isinstance(raw, str) or not ID_PATTERN.fullmatch(raw):
        raise InvalidRequest(
            'Invalid \'conversation\': expected a conversation id or {"id": "..."}.',
            param="conversation",
            code="invalid_value",
        )
    return raw


class HistorySource(Protocol):
    """A request that may name earlier turns."""

    @property
    def previous_response_id(self) -> str | None: ...

    @property
    def conversation(self) -> str | dict[str, JsonValue] | None: ...


async def read_history(source: HistorySource, store: StoreHandle, tenant: str) -> tuple[Item, ...]:
    """The items that precede the request's input: a stored chain or a conversation,
    the tenant's own (another tenant's are not found)."""
    conversation = conversation_id(source.conversation)
    if source.previous_response_id is not None and conversation is not None:
        raise InvalidRequest(
            "'previous_response_id' and 'conversation' cannot be used together.",
            param="conversation",
            code="invalid_value",
        )
    if source.previous_response_id is not None:
        return await read_chain(source.previous_response_id, store, tenant)
    if conversation is not None:
        if not store.conversations_limits.enabled:
            raise InvalidRequest(
                "The conversation store is disabled on this server, so 'conversation' "
                "cannot be used.",
                param="conversation",
                code="storage_disabled",
            )
        found = await store.get_conversation(conversation, tenant=tenant)
        return found.items if found is not None else ()
    return ()


async def read_chain(response_id: str | None, store: StoreHandle, tenant: str) -> tuple[Item, ...]:
    """The turns of the chain `response_id` ends (none without one); a 400 when the
    server keeps no responses to continue."""
    if response_id is None:
        return ()
    if not store.responses_limits.enabled:
        raise InvalidRequest(
            "Response storage is disabled on this server, so 'previous_response_id' "
            "cannot be used.",
            param="previous_response_id",
            code="storage_disabled",
        )
    return await chain_items(store, response_id, tenant)


async def resolve_references(params: ResponseParams, store: StoreHandle) -> ResponseParams:
    """`params` with each `item_reference` replaced, in its place, by the stored input or
    output item it names; an id no stored response holds is a 400."""
    if not params.references:
        return params
    items = await resolve_items(params.input, params.references, store, params.tenant)
    return dataclasses.replace(params, input=items, references=())


async def resolve_items(
    items: tuple[Item, ...],
    references: tuple[ItemReference, ...],
    store: StoreHandle,
    tenant: str,
    param: str = "input",
) -> tuple[Item, ...]:
    """`items` with the stored items `references` name put back in their places; an id no
    stored response of the tenant holds is a 400 naming that place (in `param`)."""
    if not references:
        return items
    found = await store.find_items(frozenset(r.id for r in references), tenant=tenant)
    for reference in references:
        if reference.id not in found:
            disabled = "" if store.responses_limits.enabled else " (response storage is off)"
            raise InvalidRequest(
                f"Item with id '{reference.id[:64]}' not found{disabled}.",
                param=f"{param}[{reference.index}].id",
                code="item_not_found",
            )
    named = {r.index: found[r.id] for r in references}
    rest = iter(items)
    return tuple(named[i] if i in named else next(rest) for i in range(len(items) + len(named)))


async def chain_items(store: StoreHandle, response_id: str, tenant: str) -> tuple[Item, ...]:
    """Every turn of a `previous_response_id` chain, oldest first (instructions excluded).

    The store resolves the whole walk in one call; ephemeral results of `store: false`
    jobs are never continued, nor another tenant's responses (they are not found)."""
    chain = await store.get_chain(response_id, tenant=tenant)
    if chain.missing is not None:
        raise InvalidRequest(
            f"previous response '{chain.missing}' was not found or has expired",
            param="previous_response_id",
            code="previous_response_not_found",
        )
    for record in chain.records:
        if record.status in ("queued", "in_progress"):
            raise InvalidRequest(
                f"previous response '{record.id}' has not finished (status: {record.status})",
                param="previous_response_id",
                code="previous_response_not_finished",
            )
    items: list[Item] = []
    for record in reversed(chain.records):
        items.extend(record.input_items)
        items.extend(record.output)
    return tuple(items)


def check_call_outputs(history: tuple[Item, ...], items: tuple[Item, ...]) -> None:
    """A 400 naming the first input item that answers a tool call the model never made:
    its `call_id` matches no call in the history or the input (a compaction's preserved
    turns included). The model would read a result to a question it never asked, and the
    client's bug would surface later as a confused reply instead of here."""
    if not any(isinstance(item, FunctionCallOutput) for item in items):
        return
    calls = _call_ids(history) | _call_ids(items)
    for index, item in enumerate(items):
        if isinstance(item, FunctionCallOutput) and item.call_id not in calls:
            kind = "custom tool call output" if item.custom else "function call output"
            raise InvalidRequest(
                f"No tool call found for {kind} with call_id '{item.call_id[:64]}'.",
                param=f"input[{index}].call_id",
            )


def _call_ids(items: tuple[Item, ...]) -> set[str]:
    found: set[str] = set()
    for item in items:
        if isinstance(item, FunctionCall):
            found.add(item.call_id)
        elif isinstance(item, Compaction):
            found |= _call_ids(item.preserved)
    return found
