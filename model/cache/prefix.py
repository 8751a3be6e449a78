"""The prompt (prefix) cache: KV states of earlier token sequences, reused across requests.

A thin wrapper over mlx-lm's `LRUPromptCache` (a token trie with least-recently-stored
eviction, bounded by entries and bytes), used the way `mlx_lm.server` uses it. What the
wrapper adds is the engine's invariants:

- `fetch` always hands out a private copy (mlx-lm deep-copies; the generator then writes
  into it), and never one that covers the whole prompt: the last prompt token must still
  be fed to the model to get the logits of the first new token, so an exact hit is
  trimmed by one token.
- `store` evaluates the arrays first, so an entry owns its buffers and does not pin the
  batch's KV buffers (an extracted cache is a lazy slice of them until evaluated).
- Entries are each tenant's own: a prompt is only ever served from the entries of the
  tenant that sent it, so `cached_tokens` tells no tenant what another sent. (One byte
  budget and one LRU order are shared.)
- With a disk tier (`disk.py`), an entry evicted from memory is written to a file,
  `spill_all` writes every entry (the engine calls it when it closes: at shutdown and
  on unload), and a lookup that the disk can serve with a longer prefix than memory
  reads it from there.

Import this module only on the model thread, after `load_fast_blas()`.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any, Literal

import mlx.core as mx
from mlx_lm.models.cache import LRUPromptCache, PromptTrie, can_trim_prompt_cache

from mlxcel.model.cache.disk import PromptDisk

log = logging.getLogger(__name__)

CacheKind = Literal["user", "assistant"]
"""`user`: a prompt's KV state; `assistant`: a prompt and its generated tokens."""

MAX_ENTRIES = 64
"""Entries kept at most, whatever their size (each costs a trie path of its tokens)."""

_MODEL_KEY = "model"  # one engine serves one model


def _key(tenant: str) -> str:
    """The trie's model key for a tenant's entries (the one key when there are none)."""
    return f"{_MODEL_KEY}/{tenant}" if tenant else _MODEL_KEY


def _tenant(key: str) -> str:
    """The tenant of a trie key (`_key`'s inverse)."""
    return key.partition("/")[2]


class _SpillingTrie(PromptTrie):
    """mlx-lm's trie, handing the entries the LRU evicts (`pop`; a prefix an insert
    makes redundant goes by `pop_prefixes`) to the disk tier."""

    def __init__(self, disk: PromptDisk) -> None:
        super().__init__()  # type: ignore[no-untyped-call]
        self._disk = disk

    def pop(self, model: Any, tokens: list[int]) -> Any:
        entry = super().pop(model, tokens)
        self._disk.spill(tokens, entry.prompt_cache, _tenant(model), wait=False)
        return entry


class PrefixCache:
    """Reuses the KV state of prompts already read: a request whose prompt starts with one
    kept here reads only the rest. Bounded by bytes and entries in memory, with an
    optional disk tier (`PromptDisk`) behind it."""

    def __init__(
        self, max_bytes: int, max_entries: int = MAX_ENTRIES, disk: PromptDisk | None = None
    ) -> None:
        self.max_bytes = max_bytes
        self.disk = disk
        self._lru = LRUPromptCache(max_size=max_entries, max_bytes=max_bytes)
        if disk is not None:
            self._lru._trie = _SpillingTrie(disk)

    def __len__(self) -> int:
        return len(self._lru)

    @property
    def nbytes(self) -> int:
        return int(self._lru.nbytes)

    def fetch(self, prompt: Sequence[int], tenant: str = "") -> tuple[list[Any] | None, int]:
        """A private copy of the KV state of the longest prefix of `prompt` the tenant's
        entries hold, and that prefix's length, always less than `len(prompt)`;
        `(None, 0)` on a miss."""
        cache, cached = self._fetch_memory(prompt, tenant)
        if self.disk is not None:
            loaded, length = self.disk.load(prompt, tenant, better_than=cached)
            if length:
                return loaded, length
        return cache, cached

    def _fetch_memory(self, prompt: Sequence[int], tenant: str) -> tuple[list[Any] | None, int]:
        cache, rest = self._lru.fetch_nearest_cache(_key(tenant), list(prompt))
        if cache is None:
            return None, 0
        if not rest:  # an exact hit: give back the last token so it is prefilled again
            if not can_trim_prompt_cache(cache):
                return None, 0
            for layer in cache:
                layer.trim(1)
            rest = prompt[-1:]
        cached = len(prompt) - len(rest)
        return (cache, cached) if cached > 0 else (None, 0)

    def store(
        self, tokens: Sequence[int], cache: list[Any], kind: CacheKind, tenant: str = ""
    ) -> None:
        """Keep `cache`, the KV state of exactly `tokens`, as the tenant's; the cache takes
        ownership."""
        if not tokens:
            return
        mx.eval([c.state for c in cache])
        # A copy of the tokens: the generator keeps appending to its own lists.
        self._lru.insert_cache(_key(tenant), list(tokens), cache, cache_type=kind)

    def spill_all(self) -> int:
        """Hand every entry to the disk tier (those already there just stay longer),
        waiting for room in its queue; how many were queued. The entries stay in memory.
        What the model registry calls before it unloads a model; the engine's `close`
        calls it too, and so it runs at shutdown."""
        if self.disk is None:
            return 0
        queued = 0
        order = self._lru._lru  # mlx-lm's LRU order: a deque of (key, tokens) per kind
        for kind in order._ordering:
            for key, tokens in list(order._lrus[kind]):
                entry = self._lru._trie.get(key, tokens)
                queued += self.disk.spill(tokens, entry.prompt_cache, _tenant(key), wait=True)
        return queued

    def close(self) -> None:
        """Spill every entry and wait for the disk tier's writes."""
        if self.disk is not None:
            count = self.spill_all()
            self.disk.close()
            log.info("prompt cache: %d entries spilled to disk", count)

    def fit(self, live_bytes: int) -> None:
        """Evict until the cache and the live sequences' KV states fit `max_bytes`
        (and release the states the disk tier has written since)."""
        if self.disk is not None:
            self.disk.reap()
        self._lru.trim_to(n_bytes=self.max_bytes - live_bytes)


def common_prefix(a: Sequence[int], b: Sequence[int], floor: int) -> int:
    """How many leading tokens `a` and `b` share; 0 when it is fewer than `floor`."""
    if min(len(a), len(b)) < floor or a[:floor] != b[:floor]:
        return 0
    lo, hi = floor, min(len(a), len(b))  # the prefix is at least `lo` long: halve to its end
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if a[:mid] == b[:mid]:
            lo = mid
        else:
            hi = mid - 1
    return lo
