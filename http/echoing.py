"""The HTTP edge of the reasoning-echo cache: which turns to restore, and under what key.

Only requests that resend their own history take part: with `previous_response_id` or a
`conversation`, the server already holds the reasoning of earlier turns.
"""

from __future__ import annotations

import json

from mlxcel.actors.echo import EchoHandle, turn_key, turn_prefix
from mlxcel.http.schemas import CreateResponseBody
from mlxcel.items import Item, Message, Reasoning


def _signature(body: CreateResponseBody) -> str:
    return json.dumps([body.tools or [], body.chat_template_kwargs or {}], sort_keys=True)


def _session(body: CreateResponseBody) -> str:
    return body.prompt_cache_key or body.user or ""


def echo_prefix(body: CreateResponseBody, model: str, items: tuple[Item, ...]) -> str | None:
    """The key prefix under which this response's reasoning is remembered, if at all."""
    if body.previous_response_id is not None or body.conversation is not None:
        return None
    return turn_prefix(model, _signature(body), _session(body), items)


async def restore_reasoning(
    body: CreateResponseBody, model: str, items: tuple[Item, ...], echo: EchoHandle
) -> tuple[Item, ...]:
    """`items` with remembered reasoning put back before assistant turns that lack it.

    A trace the client sent itself always wins."""
    if not echo.enabled or echo_prefix(body, model, ()) is None:
        return items
    wanted: dict[int, str] = {}
    for index, item in enumerate(items):
        if not isinstance(item, Message) or item.role != "assistant":
            continue
        if index > 0 and isinstance(items[index - 1], Reasoning):
            continue
        prefix = turn_prefix(model, _signature(body), _session(body), items[:index])
        wanted[index] = turn_key(prefix, item.text)
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
