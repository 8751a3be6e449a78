"""The reasoning-echo cache: puts back reasoning a client dropped from a resent turn.

Clients that resend the whole history usually drop the reasoning items of earlier turns.
The server remembers the reasoning it returned with each ordinary response, keyed by
everything that decides how that turn renders (model, template arguments and tools, the
client's session, every earlier item as sent, and the trimmed assistant text), so when
the same turn comes back without its reasoning it renders exactly as it was generated.
Bounded by bytes, least recently used first; 0 bytes disables it.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
from collections.abc import Sequence
from typing import Any

import trio
from cachetools import LRUCache

from mlxcel.actors.messages import EchoCommand, Recall, Remember
from mlxcel.items import (
    Compaction,
    FunctionCall,
    FunctionCallOutput,
    Item,
    Message,
    Reasoning,
    replay,
)


class TurnHasher:
    """Turn-key prefixes of a growing item list in one pass: each item is hashed once.

    `prefix()` equals `turn_prefix(..., items so far)`: a compaction restarts the digest
    from the system and developer messages before it, as `replay` does."""

    def __init__(self, model: str, signature: Any, session: str) -> None:
        header = json.dumps([model, signature, session], sort_keys=True, default=str).encode()
        self._all = hashlib.sha256(header)
        self._kept = self._all.copy()  # what a later compaction keeps

    def prefix(self) -> str:
        return self._all.hexdigest()

    def add(self, item: Item) -> None:
        if isinstance(item, Compaction):
            self._all = self._kept.copy()
            for kept in replay([item]):
                _hash_item(self._all, kept)
            return
        _hash_item(self._all, item)
        if isinstance(item, Message) and item.role in ("system", "developer"):
            _hash_item(self._kept, item)


def _hash_item(digest: Any, item: Item) -> None:
    match item:
        case Message(role=role):
            digest.update(json.dumps(["m", role, item.text]).encode())
        case FunctionCall(call_id=call_id, arguments=arguments):
            digest.update(json.dumps(["c", call_id, item.flat_name, arguments]).encode())
        case FunctionCallOutput(call_id=call_id, output=output):
            digest.update(json.dumps(["o", call_id, output]).encode())
        case Reasoning() | Compaction():
            pass  # what the client may drop must not change the key


def turn_prefix(model: str, signature: Any, session: str, earlier: Sequence[Item]) -> str:
    """The part of a key fixed before the assistant turn: all but its own text."""
    hasher = TurnHasher(model, signature, session)
    for item in earlier:
        hasher.add(item)
    return hasher.prefix()


def turn_key(prefix: str, assistant_text: str) -> str:
    return hashlib.sha256(f"{prefix}\x00{assistant_text.strip()}".encode()).hexdigest()


class EchoHandle:
    def __init__(self, inbox: trio.MemorySendChannel[EchoCommand], enabled: bool) -> None:
        self._inbox = inbox
        self.enabled = enabled

    async def remember(self, key: str, reasoning: str) -> None:
        if self.enabled and reasoning.strip():
            await self._inbox.send(Remember(key, reasoning))

    async def recall(self, keys: Sequence[str]) -> dict[str, str]:
        if not self.enabled or not keys:
            return {}
        send, recv = trio.open_memory_channel[dict[str, str]](1)
        await self._inbox.send(Recall(tuple(keys), send))
        return await recv.receive()


class EchoActor:
    def __init__(self, max_bytes: int) -> None:
        self._max_bytes = max_bytes
        self._traces: LRUCache[str, str] = LRUCache(
            maxsize=max(max_bytes, 1), getsizeof=lambda text: len(text.encode())
        )

    async def run(
        self, *, task_status: trio.TaskStatus[EchoHandle] = trio.TASK_STATUS_IGNORED
    ) -> None:
        """Serve remember/recall until cancelled.

        Resource handling: traces are bounded by `max_bytes` (LRU); a trace larger than
        the whole budget is not kept. The inbox is unbuffered.

        Error handling: a caller gone before its reply is ignored; nothing else raises.
        """
        send, recv = trio.open_memory_channel[EchoCommand](0)
        task_status.started(EchoHandle(send, self._max_bytes > 0))
        async with recv:
            async for command in recv:
                match command:
                    case Remember(key, reasoning):
                        with contextlib.suppress(ValueError):  # larger than the budget
                            self._traces[key] = reasoning
                    case Recall(keys, reply):
                        found = {k: self._traces[k] for k in keys if k in self._traces}
                        with contextlib.suppress(trio.BrokenResourceError):
                            reply.send_nowait(found)
