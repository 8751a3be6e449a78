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

Import this module only on the model thread, after `load_fast_blas()`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Literal

import mlx.core as mx
from mlx_lm.models.cache import LRUPromptCache, can_trim_prompt_cache

CacheKind = Literal["user", "assistant"]
"""`user`: a prompt's KV state; `assistant`: a prompt and its generated tokens."""

MAX_ENTRIES = 64
"""Entries kept at most, whatever their size (each costs a trie path of its tokens)."""

_MODEL_KEY = "model"  # one engine serves one model


def _key(tenant: str) -> str:
    """The trie's model key for a tenant's entries (the one key when there are none)."""
    return f"{_MODEL_KEY}/{tenant}" if tenant else _MODEL_KEY


class PrefixCache:
    def __init__(self, max_bytes: int, max_entries: int = MAX_ENTRIES) -> None:
        self.max_bytes = max_bytes
        self._lru = LRUPromptCache(max_size=max_entries, max_bytes=max_bytes)

    def __len__(self) -> int:
        return len(self._lru)

    @property
    def nbytes(self) -> int:
        return int(self._lru.nbytes)

    def fetch(self, prompt: Sequence[int], tenant: str = "") -> tuple[list[Any] | None, int]:
        """A private copy of the KV state of the longest prefix of `prompt` the tenant's
        entries hold, and that prefix's length, always less than `len(prompt)`;
        `(None, 0)` on a miss."""
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

    def fit(self, live_bytes: int) -> None:
        """Evict until the cache and the live sequences' KV states fit `max_bytes`."""
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
