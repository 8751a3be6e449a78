"""What the store backends' state machine (`tests/store/test_backends.py`) checks between
steps, reading without touching (no expiry, no LRU order changes): each backend within
its limits and its counters, the same entries in the same eviction order, and Redis's
keys, indexes and job owners as the others hold them."""

from __future__ import annotations

import json
import sqlite3
from typing import Any

from cachetools import Cache
from hypothesis.stateful import RuleBasedStateMachine, invariant

from mlxcel.store import JobOwner, StoreLimits, Table
from mlxcel.store.codec import encoded_size
from mlxcel.store.memory import MemoryBackend
from mlxcel.store.redis import RedisBackend
from mlxcel.store.sqlite import SqliteBackend

from redis_server import RedisConnection
from store_draws import BOUNDED


class BackendsInvariants(RuleBasedStateMachine):
    """The invariants of the backends' machine, over the state its rules keep."""

    backends: tuple[MemoryBackend, SqliteBackend, RedisBackend] | None
    reader: sqlite3.Connection | None
    """A read-only connection to the SQLite backend's file."""
    raw: RedisConnection | None
    """A connection of the machine's own to Redis, for the invariants."""
    prefix: str
    limits: dict[Table, StoreLimits]
    holders: dict[str, JobOwner]
    """Who holds each unfinished job, as the backends say."""

    def redis_call(self, *args: str) -> Any:
        assert self.raw is not None
        self.raw.send(*args)
        return self.raw.reply()

    @invariant()
    def memory_tables_are_within_their_limits(self) -> None:
        assert self.backends is not None
        memory = self.backends[0]
        for table in BOUNDED:
            cache = memory._tables[table]._cache
            keys = list(Cache.__iter__(cache))
            size = Cache.currsize.fget(cache)  # type: ignore[attr-defined]
            assert size == sum(encoded_size(Cache.__getitem__(cache, k)) for k in keys)
            assert len(keys) <= self.limits[table].max_entries
            assert size <= self.limits[table].max_bytes
        index = memory._tables[Table.RESPONSES].index
        assert index is not None
        assert set(index._keys) == set(Cache.__iter__(memory._tables[Table.RESPONSES]._cache))
        for pinned in memory._active.values():
            assert pinned.size == encoded_size(pinned.record)

    @invariant()
    def the_file_is_within_its_limits_and_its_counters(self) -> None:
        assert self.reader is not None
        assert self.backends is not None
        sqlite = self.backends[1]
        rows = self.reader.execute(
            "SELECT tbl, count(*), sum(size), sum(size != length(body)) FROM entries GROUP BY tbl"
        ).fetchall()
        in_file = {Table(tbl): (entries, size) for tbl, entries, size, _ in rows}
        assert all(wrong == 0 for *_, wrong in rows)
        for table in Table:
            assert list(in_file.get(table, (0, 0))) == sqlite._rows.counts[table]
        for table in BOUNDED:
            entries, size = in_file.get(table, (0, 0))
            assert entries <= self.limits[table].max_entries
            assert size <= self.limits[table].max_bytes
        (strays,) = self.reader.execute(
            "SELECT count(*) FROM items WHERE response_id NOT IN "
            "(SELECT id FROM entries WHERE tbl = 'responses')"
        ).fetchone()
        assert strays == 0

    @invariant()
    def both_hold_the_same_entries_in_the_same_eviction_order(self) -> None:
        """Expired entries not yet dropped included: each backend drops them at the same
        operations, and evicts in the same least-recently-used order."""
        assert self.reader is not None
        assert self.backends is not None
        memory = self.backends[0]
        for table in BOUNDED:
            cache = memory._tables[table]._cache
            in_memory = list(cache._TTLCache__links)  # type: ignore[attr-defined]
            in_file = [
                key
                for (key,) in self.reader.execute(
                    "SELECT id FROM entries WHERE tbl = ? ORDER BY last_access", (table.value,)
                )
            ]
            assert in_memory == in_file, table
        # Unfinished jobs: the same, in the order a reap ends them.
        in_file_active = [
            key
            for (key,) in self.reader.execute(
                "SELECT id FROM entries WHERE tbl = 'active' ORDER BY last_access"
            )
        ]
        assert list(memory._active) == in_file_active

    @invariant()
    def redis_keeps_its_counters_indexes_and_eviction_order(self) -> None:
        """Read raw in one script (nothing expires, no LRU order changes)."""
        assert self.backends is not None
        memory, sqlite = self.backends[0], self.backends[1]
        raw = self.redis_call("EVAL", SNAPSHOT, "0", "{" + self.prefix + "}:")
        snapshot = json.loads(raw)
        for table in Table:
            keys = {part: _listed(v) for part, v in snapshot[table.value].items()}
            ids = sorted(keys["ids"])
            stored = int(snapshot[table.value]["bytes"])
            assert stored == sum(keys["lengths"]), table
            assert [len(ids), stored] == sqlite._rows.counts[table], table
            order = keys["lru"]
            assert sorted(order) == ids, table
            assert sorted(keys["ver"]) == ids, table
            assert set(keys["link"]) <= set(ids), table
            ttl = self.limits[table].ttl_secs if table in BOUNDED else 0
            assert set(keys["exp"]) == (set(ids) if ttl > 0 else set()), table
            if table in BOUNDED:
                cache = memory._tables[table]._cache
                assert order == list(cache._TTLCache__links), table  # type: ignore[attr-defined]
            else:
                assert order == list(memory._active), table
        owners = _listed(snapshot["owners"])
        held = {owners[n]: JobOwner(*owners[n + 1].split("\n")) for n in range(0, len(owners), 2)}
        assert held == self.holders
        assert set(_listed(snapshot["cancels"])) <= set(self.holders)
        # The item index: each stored response's (tenant, id) keys once, each key's
        # sorted set holding exactly the responses that list it, at the listed place.
        responses = set(_listed(snapshot["responses"]["ids"]))
        indexed = _listed(snapshot["itemkeys"])
        by_response = {
            indexed[n]: {(key, place) for key, place in json.loads(indexed[n + 1])}
            for n in range(0, len(indexed), 2)
        }
        assert set(by_response) <= responses
        for places in by_response.values():
            assert len({key for key, _ in places}) == len(places)  # each key once
        listed = {(rid, key, place) for rid, places in by_response.items() for key, place in places}
        held = set()
        sets = _listed(snapshot["ix"])
        for n in range(0, len(sets), 2):
            key = sets[n].removeprefix("{" + self.prefix + "}:ix:")
            members = _listed(sets[n + 1])
            assert members
            for member in members:
                rid, _, place = member.rpartition("\n")
                held.add((rid, key, place))
        assert held == listed


def _listed(value: Any) -> list[Any]:
    """A Lua table cjson encoded: an empty one comes as `{}`."""
    return value if isinstance(value, list) else []


SNAPSHOT = """
local B = ARGV[1]
local out = {}
for _, t in ipairs({'responses', 'conversations', 'ephemeral', 'active'}) do
  local body = B .. t .. ':body'
  local ids = redis.call('HKEYS', body)
  local lengths = {}
  for i, id in ipairs(ids) do lengths[i] = redis.call('HSTRLEN', body, id) end
  out[t] = {
    ids = ids, lengths = lengths, bytes = redis.call('GET', B .. t .. ':bytes') or '0',
    lru = redis.call('ZRANGE', B .. t .. ':lru', 0, -1),
    exp = redis.call('ZRANGE', B .. t .. ':exp', 0, -1),
    ver = redis.call('HKEYS', B .. t .. ':ver'), link = redis.call('HKEYS', B .. t .. ':link'),
  }
end
out.owners = redis.call('HGETALL', B .. 'active:owner')
out.cancels = redis.call('SMEMBERS', B .. 'active:cancel')
out.itemkeys = redis.call('HGETALL', B .. 'responses:itemkeys')
out.ix = {}
for _, key in ipairs(redis.call('KEYS', B .. 'ix:*')) do
  out.ix[#out.ix + 1] = key
  out.ix[#out.ix + 1] = redis.call('ZRANGE', key, 0, -1)
end
return cjson.encode(out)
"""
"""Every key of a run's Redis store, read in one step, as JSON."""
