"""The request side of the reasoning-echo cache: which turns to restore, and under what key.

Only requests that resend their own history take part: with `previous_response_id` or a
`conversation`, the server already holds the reasoning of earlier turns.
"""

from __future__ import annotations

import dataclasses
import json

from mlxcel.items import Item, Message, Reasoning
from mlxcel.prepare.offload import off_loop
from mlxcel.prepare.params import ResponseParams
from mlxcel.store.echo import EchoHandle, TurnHasher, signed_key, turn_key, turn_prefix


def _signature(params: ResponseParams) -> str:
    return json.dumps([params.tools or [], params.chat_template_kwargs or {}], sort_keys=True)


def _session(params: ResponseParams) -> str:
    return params.prompt_cache_key or params.user or ""


def echo_prefix(params: ResponseParams, model: str, items: tuple[Item, ...]) -> str | None:
    """The key prefix under which this response's reasoning is remembered, if at all."""
    if params.previous_response_id is not None or params.conversation is not None:
        return None
    return turn_prefix(model, _signature(params), _session(params), items, params.tenant)


def reasoning_keys(params: ResponseParams, model: str, items: tuple[Item, ...]) -> dict[int, str]:
    """The echo key of each assistant turn that lacks its reasoning, by index; one pass
    over `items`, so the cost is linear in their size."""
    hasher = TurnHasher(model, _signature(params), _session(params), params.tenant)
    wanted: dict[int, str] = {}
    for index, item in enumerate(items):
        if (
            isinstance(item, Message)
            and item.role == "assistant"
            and not (index > 0 and isinstance(items[index - 1], Reasoning))
        ):
            wanted[index] = turn_key(hasher.prefix(), item.text)
        hasher.add(item)
    return wanted


async def restore_reasoning(
    params: ResponseParams, model: str, items: tuple[Item, ...], echo: EchoHandle
) -> tuple[Item, ...]:
    """`items` with remembered reasoning put back before assistant turns that lack it.

    A trace the client sent itself always wins. The keys are worked out off the loop."""
    if not echo.enabled or echo_prefix(params, model, ()) is None:
        return items
    wanted = await off_loop(reasoning_keys, params, model, items)
    found = await echo.recall(list(wanted.values()))
    if not found:
        return items
    restored: list[Item] = []
    for index, item in enumerate(items):
        key = wanted.get(index)
        if key is not None and key in found:
            restored.append(Reasoning(found[key]))
        restored.append(item)
    return tuple(restored)


async def restore_signed(
    params: ResponseParams, items: tuple[Item, ...], echo: EchoHandle
) -> tuple[Item, ...]:
    """`items` (the request's input) with each reasoning item the client sent with a
    signature (`params.signed`) holding the trace filed under it for this tenant, when
    one is; the text sent with it stands otherwise."""
    if not params.signed or not echo.enabled:
        return items
    keys = {index: signed_key(params.tenant, signature) for index, signature in params.signed}
    found = await echo.recall(list(dict.fromkeys(keys.values())))
    if not found:
        return items
    restored = list(items)
    for index, key in keys.items():
        item = restored[index] if index < len(restored) else None
        if isinstance(item, Reasoning) and key in found:
            restored[index] = dataclasses.replace(item, text=found[key])
    return tuple(restored)
