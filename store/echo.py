"""The reasoning-echo cache: puts back reasoning a client dropped from a resent turn.

Clients that resend the whole history usually drop the reasoning items of earlier turns.
The server remembers the reasoning it returned with each ordinary response, keyed by
everything that decides how that turn renders (model, template arguments and tools, the
client's session, every earlier item as sent, and the trimmed assistant text) and by the
tenant that asked (so no tenant is ever given another's trace), so when
the same turn comes back without its reasoning it renders exactly as it was generated.
A trace may also be handed out with a signature (`trace_signature`, as Anthropic's thinking
blocks carry one) and filed under it too, so a block sent back with its signature gets
the trace restored exactly as generated, whatever text came with it.
Bounded by bytes, least recently used first; 0 bytes disables it. The traces are kept by
the store's backend: in memory, or in the SQLite file, where they survive a restart.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from typing import Any, Protocol

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

    def __init__(self, model: str, signature: Any, session: str, tenant: str = "") -> None:
        fields = [model, signature, session, tenant] if tenant else [model, signature, session]
        header = json.dumps(fields, sort_keys=True, default=str).encode()
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


def turn_prefix(
    model: str, signature: Any, session: str, earlier: Sequence[Item], tenant: str = ""
) -> str:
    """The part of a key fixed before the assistant turn: all but its own text. One
    tenant's keys never equal another's ("" — one tenant — keeps the keys of before)."""
    hasher = TurnHasher(model, signature, session, tenant)
    for item in earlier:
        hasher.add(item)
    return hasher.prefix()


def turn_key(prefix: str, assistant_text: str) -> str:
    return hashlib.sha256(f"{prefix}\x00{assistant_text.strip()}".encode()).hexdigest()


def trace_signature(prefix: str, trace: str) -> str:
    """The signature a trace is handed out with (Anthropic's thinking blocks carry one):
    its hash under the key prefix of the turn that generated it, so it names that trace
    in that context alone. Known as soon as the trace ends, before the answer after it."""
    return hashlib.sha256(f"{prefix}\x00thinking\x00{trace}".encode()).hexdigest()


def signed_key(tenant: str, signature: str) -> str:
    """Where a signed trace is filed: by its signature and the tenant it was shown to, so
    a signature that reaches another tenant finds nothing."""
    return hashlib.sha256(f"{tenant}\x00signed\x00{signature}".encode()).hexdigest()


class Traces(Protocol):
    """Where traces are kept: the store's backend (`store/backend.py`)."""

    async def remember(self, key: str, reasoning: str) -> None: ...

    async def recall(self, keys: tuple[str, ...]) -> dict[str, str]: ...


class EchoHandle:
    """The cache's two questions, answered by the store's backend (so, with a durable
    store, traces outlive the process); off when its byte budget is 0."""

    def __init__(self, traces: Traces, enabled: bool) -> None:
        self._traces = traces
        self.enabled = enabled

    async def remember(self, key: str, reasoning: str) -> None:
        if self.enabled and reasoning.strip():
            await self._traces.remember(key, reasoning)

    async def recall(self, keys: Sequence[str]) -> dict[str, str]:
        if not self.enabled or not keys:
            return {}
        return await self._traces.recall(tuple(keys))
