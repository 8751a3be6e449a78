"""The event logs on the Redis store: a Redis Stream per response, which any replica
reads, so a resume is served wherever it lands while another replica runs the job.

A log is the stream `evs:<id>` (entry `<seq + 1>-0` holds frame `seq` in its field `f`)
and the hash `evm:<id>` (`count`, `truncated`, and `ended` once its terminal frame is
in). A log is ended by its job, or, when the job's replica died, by the first reader
that finds the job ended; one left unended goes a day after its last frame. The logs'
bytes are summed in `ev:bytes` (each log's in the hash `ev:sizes`); the
ended logs are ordered by their end in `ev:ended` (dropped first for room) and by their
expiry in `ev:exp` (dropped by the next append or read once due). Appends and reads are
one script each, so the bounds hold whichever replica writes; a deleted response's log
goes in the script that deletes the response.

Readers follow a log with `XREAD BLOCK`: in each process only one reader of a log blocks
on Redis at a time (its followers wait on a doorbell it rings), so a hundred resumers of
one response hold one connection, and no reader ever holds the pool.
"""

from __future__ import annotations

from typing import Any

import trio

from mlxcel.store.event_log import Doorbell, EventLimits, LogSlice
from mlxcel.store.redis.backend import RedisBackend
from mlxcel.store.redis.scripts import script
from mlxcel.store.redis.values import FAILURES
from mlxcel.store.tables import Table, TableStatistics

UNENDED_LOG_SECS = 86_400
"""A log not ended this long after its last frame is dropped: its job's replica died
(the job was reaped elsewhere) and no reader ended it."""
BLOCK_MS = 1000
"""How long one `XREAD BLOCK` waits (shielded, well within the command timeout)."""

_DROP = r"""
local function drop_log(id)
  local size = tonumber(redis.call('HGET', k('ev:sizes'), id) or '0')
  redis.call('DECRBY', k('ev:bytes'), size)
  redis.call('HDEL', k('ev:sizes'), id)
  redis.call('ZREM', k('ev:ended'), id)
  redis.call('ZREM', k('ev:exp'), id)
  redis.call('DEL', k('evs:' .. id), k('evm:' .. id))
end
for _, id in ipairs(redis.call('ZRANGEBYSCORE', k('ev:exp'), '-inf', NOW)) do drop_log(id) end
"""

APPEND = script(
    _DROP
    + r"""
-- ARGV[3]: id, [4]: first, [5]: max events, [6]: max bytes, [7]: end ttl ('' when the
-- log goes on), [8..]: frames, then the life of a log left unended. -1 when not
-- appended, else 1 kept / 0 dropped.
local id, first = ARGV[3], tonumber(ARGV[4])
local meta, stream = k('evm:' .. id), k('evs:' .. id)
local had = redis.call('HGET', meta, 'count')
if not had then
  if first ~= 0 then return -1 end
  redis.call('HSET', meta, 'count', 0, 'truncated', 0)
  redis.call('HSET', k('ev:sizes'), id, 0)
  had = 0
end
if tonumber(had) ~= first or redis.call('HEXISTS', meta, 'ended') == 1 then return -1 end
local n, size, kept = #ARGV - 8, 0, 0
for i = 8, 7 + n do size = size + #ARGV[i] end
if redis.call('HGET', meta, 'truncated') == '0' then
  local budget = tonumber(ARGV[6])
  local used = tonumber(redis.call('GET', k('ev:bytes')) or '0')
  while used + size > budget do
    local oldest = redis.call('ZRANGE', k('ev:ended'), 0, 0)
    if #oldest == 0 then break end
    drop_log(oldest[1])
    used = tonumber(redis.call('GET', k('ev:bytes')) or '0')
  end
  if first + n > tonumber(ARGV[5]) or used + size > budget then
    local mine = tonumber(redis.call('HGET', k('ev:sizes'), id) or '0')
    redis.call('DECRBY', k('ev:bytes'), mine)
    redis.call('HSET', k('ev:sizes'), id, 0)
    redis.call('DEL', stream)
    redis.call('HSET', meta, 'truncated', 1)
  else
    for i = 8, 7 + n do
      redis.call('XADD', stream, (first + i - 7) .. '-0', 'f', ARGV[i])
    end
    redis.call('HINCRBY', k('ev:sizes'), id, size)
    redis.call('INCRBY', k('ev:bytes'), size)
    kept = 1
  end
end
redis.call('HSET', meta, 'count', first + n)
if ARGV[7] ~= '' then
  redis.call('HSET', meta, 'ended', ARGV[2])
  redis.call('ZADD', k('ev:ended'), NOW, id)
  local ttl = tonumber(ARGV[7])
  if ttl > 0 then
    redis.call('ZADD', k('ev:exp'), NOW + ttl, id)
  else
    redis.call('ZREM', k('ev:exp'), id)
  end
else
  redis.call('ZADD', k('ev:exp'), NOW + tonumber(ARGV[8 + n]), id)
end
return kept
"""
)

READ = script(
    _DROP
    + r"""
-- ARGV[3]: id, [4]: after, [5]: limit. nil when there is no log, else
-- {count, ended, truncated, frames...}.
local meta = k('evm:' .. ARGV[3])
local had = redis.call('HGET', meta, 'count')
if not had then return false end
local truncated = tonumber(redis.call('HGET', meta, 'truncated'))
local out = {tonumber(had), redis.call('HEXISTS', meta, 'ended'), truncated}
if truncated == 0 then
  local start = string.format('%d', tonumber(ARGV[4]) + 2) .. '-0'
  local entries = redis.call('XRANGE', k('evs:' .. ARGV[3]), start, '+', 'COUNT', ARGV[5])
  for _, entry in ipairs(entries) do out[#out + 1] = entry[2][2] end
end
return out
"""
)


STATISTICS = script(
    _DROP
    + r"""
return {redis.call('HLEN', k('ev:sizes')), tonumber(redis.call('GET', k('ev:bytes')) or '0')}
"""
)

DELETE_RESPONSE = script(
    _DROP
    + r"""
-- ARGV[3]: id, [4..]: the tables it may be in. 1 when it was (live) in one, else 0; its
-- log is dropped either way.
local id, found = ARGV[3], 0
for i = 4, #ARGV do
  if live(ARGV[i], id) then
    remove(ARGV[i], id)
    found = 1
  end
end
drop_log(id)
return found
"""
)


class RedisEventLog:
    """`EventLog` on the Redis store (see the module docstring): a part of the backend
    kept in a module of its own, using its script runner and client."""

    def __init__(self, backend: RedisBackend, limits: EventLimits) -> None:
        self._backend = backend
        self.limits = limits
        self._bell = Doorbell()
        self._following: set[str] = set()
        """The logs a reader of this process follows on Redis now."""

    async def append(
        self, response_id: str, first: int, frames: tuple[bytes, ...], *, end_ttl: float | None
    ) -> bool:
        ending = "" if end_ttl is None else repr(float(end_ttl))
        limits = self.limits
        kept = await self._backend._run(
            APPEND,
            response_id,
            str(first),
            str(limits.max_events),
            str(limits.max_bytes),
            ending,
            *frames,
            str(UNENDED_LOG_SECS),
        )
        self._bell.ring(response_id)
        return int(kept) == 1

    async def read(self, response_id: str, after: int, limit: int) -> LogSlice | None:
        found: list[Any] | None = await self._backend._run(
            READ, response_id, str(after), str(limit)
        )
        if found is None:
            return None
        count, ended, truncated, *frames = found
        return LogSlice(tuple(frames), int(count), bool(ended), bool(truncated))

    async def statistics(self) -> TableStatistics:
        logs, size = await self._backend._run(STATISTICS)
        return TableStatistics(entries=int(logs), bytes=int(size))

    async def delete_response(self, response_id: str, tables: tuple[Table, ...]) -> bool:
        names = (table.value for table in tables)
        found = await self._backend._run(DELETE_RESPONSE, response_id, *names)
        self._bell.ring(response_id)  # a follower reads again and finds it gone
        return bool(found)

    async def wait(self, response_id: str, after: int) -> None:
        if response_id in self._following:
            await self._bell.wait(response_id)  # rung when the one blocking on Redis wakes
            return
        self._following.add(response_id)
        try:
            # Shielded: a command cut off mid-answer would leave its connection's reply
            # behind; it ends within BLOCK_MS anyway.
            with trio.CancelScope(shield=True):
                await self._block(response_id, after)
        finally:
            self._following.discard(response_id)
            self._bell.ring(response_id)

    async def _block(self, response_id: str, after: int) -> None:
        """Until a frame numbered above `after` is in the stream, or `BLOCK_MS`; a store
        that cannot be reached waits as long and answers nothing (the next read says)."""
        backend = self._backend
        stream = backend.base + "evs:" + response_id
        try:
            await backend._client.xread({stream: f"{after + 1}-0"}, count=1, block=BLOCK_MS)
        except FAILURES:
            await trio.sleep(BLOCK_MS / 1000)
