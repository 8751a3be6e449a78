"""The Redis store's pending webhook deliveries (`store/deliveries.py`), shared by the
replicas, under `{PREFIX}:`: a hash of bodies, a hash of each one's tenant, a sorted set
of due times per tenant (its size is the tenant's count) and a sorted set of tenants by
their earliest due time, so a claim looks only at tenants with something due and takes
each one's earliest; each operation one script, so a claim by one replica is never also
another's."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from mlxcel.store.deliveries import (
    MAX_PENDING,
    Added,
    Delivery,
    UnreadableDeliveries,
    encode_delivery,
)

Run = Callable[..., Awaitable[Any]]
"""The backend's `_run`: one script, given the key base and the time before its args."""

_PRELUDE = r"""
local B = ARGV[1]
local now = tonumber(ARGV[2])
local bodies, owners, firsts = B .. 'webhooks:body', B .. 'webhooks:tenant', B .. 'webhooks:next'
local function due_of(tenant) return B .. 'webhooks:due-of:' .. tenant end
-- The tenant's place among tenants: its earliest due time, or none when it keeps none.
local function refresh(tenant)
  local first = redis.call('ZRANGE', due_of(tenant), 0, 0, 'WITHSCORES')
  if first[2] then
    redis.call('ZADD', firsts, first[2], tenant)
  else
    redis.call('ZREM', firsts, tenant)
  end
end
-- Forget where `id` was due (under the tenant it was kept for).
local function unplace(id)
  local tenant = redis.call('HGET', owners, id)
  if tenant then
    redis.call('ZREM', due_of(tenant), id)
    redis.call('HDEL', owners, id)
    refresh(tenant)
  end
end
"""

ADD = (
    _PRELUDE
    + r"""
-- ARGV[3]: response id, ARGV[4]: tenant, ARGV[5]: body, ARGV[6]: delay, ARGV[7]: most
-- kept, ARGV[8]: most of one tenant ('' for no bound), ARGV[9]: '1' to settle (only
-- replace one kept), ARGV[10]: '1' to replace only one whose end is unknown. What was
-- done, as `Added` names it.
local id, tenant = ARGV[3], ARGV[4]
local kept = redis.call('HGET', bodies, id)
if kept and ARGV[10] == '1' then
  local status = cjson.decode(kept).status
  if status ~= nil and status ~= cjson.null then return 'known' end
end
if not kept then
  if ARGV[9] == '1' then return 'gone' end
  if redis.call('HLEN', bodies) >= tonumber(ARGV[7]) then return 'full' end
  if ARGV[8] ~= '' and redis.call('ZCARD', due_of(tenant)) >= tonumber(ARGV[8]) then
    return 'tenant_full'
  end
end
unplace(id)
redis.call('HSET', bodies, id, ARGV[5])
redis.call('HSET', owners, id, tenant)
redis.call('ZADD', due_of(tenant), now + tonumber(ARGV[6]), id)
refresh(tenant)
return 'kept'
"""
)

CLAIM = (
    _PRELUDE
    + r"""
-- ARGV[3]: most taken, ARGV[4]: lease, ARGV[5]: most of any one tenant ('' for no
-- bound), then pairs of a tenant and its own most. Each one taken: its id, then its body.
local left, lease, each = tonumber(ARGV[3]), tonumber(ARGV[4]), tonumber(ARGV[5])
local rooms = {}
for i = 6, #ARGV - 1, 2 do rooms[ARGV[i]] = tonumber(ARGV[i + 1]) end
local out = {}
for _, tenant in ipairs(redis.call('ZRANGEBYSCORE', firsts, '-inf', now)) do
  if left <= 0 then break end
  local room = rooms[tenant] or each or left
  if room > left then room = left end
  if room > 0 then
    local due = due_of(tenant)
    for _, id in ipairs(redis.call('ZRANGEBYSCORE', due, '-inf', now, 'LIMIT', 0, room)) do
      local body = redis.call('HGET', bodies, id)
      if body then
        redis.call('ZADD', due, now + lease, id)
        out[#out + 1] = id
        out[#out + 1] = body
        left = left - 1
      else
        redis.call('ZREM', due, id)
      end
    end
    refresh(tenant)
  end
end
return out
"""
)

DROP = (
    _PRELUDE
    + r"""
-- ARGV[3]: response id.
unplace(ARGV[3])
return redis.call('HDEL', bodies, ARGV[3])
"""
)

UPGRADE = (
    _PRELUDE
    + r"""
-- An earlier release kept every due time in one sorted set: each id goes to its
-- tenant's, read from its body (one no longer kept is left out). How many moved.
local old = B .. 'webhooks:due'
local places = redis.call('ZRANGE', old, 0, -1, 'WITHSCORES')
local moved = 0
for i = 1, #places - 1, 2 do
  local id = places[i]
  local body = redis.call('HGET', bodies, id)
  if body then
    local ok, delivery = pcall(cjson.decode, body)
    local tenant = ok and type(delivery) == 'table' and delivery.tenant or ''
    if type(tenant) ~= 'string' then tenant = '' end
    redis.call('HSET', owners, id, tenant)
    redis.call('ZADD', due_of(tenant), places[i + 1], id)
    refresh(tenant)
    moved = moved + 1
  end
end
redis.call('DEL', old)
return moved
"""
)
"""Idempotent: replicas starting together may each run it."""


class RedisDeliveries:
    """`Deliveries` in the shared Redis store."""

    def __init__(self, run: Run) -> None:
        self._run = run
        self._unreadable = UnreadableDeliveries()

    async def add(
        self,
        delivery: Delivery,
        delay_secs: float,
        *,
        settle: bool = False,
        unknown_only: bool = False,
        share: int | None = None,
    ) -> Added:
        body = encode_delivery(delivery)
        args = (
            *(delivery.response_id, delivery.tenant, body, repr(float(delay_secs))),
            *(str(MAX_PENDING), "" if share is None else str(share)),
            *("1" if settle else "0", "1" if unknown_only else "0"),
        )
        done = await self._run(ADD, *args)
        return Added(done.decode() if isinstance(done, bytes) else str(done))

    async def claim(
        self,
        limit: int,
        lease_secs: float,
        *,
        each: int | None = None,
        rooms: Mapping[str, int] | None = None,
    ) -> tuple[Delivery, ...]:
        pairs = [part for tenant, room in (rooms or {}).items() for part in (tenant, str(room))]
        args = (str(limit), repr(float(lease_secs)), "" if each is None else str(each))
        flat = await self._run(CLAIM, *args, *pairs)
        taken = [(flat[n].decode(), flat[n + 1]) for n in range(0, len(flat), 2)]
        return self._unreadable.readable(taken)

    async def drop(self, response_id: str) -> bool:
        return bool(await self._run(DROP, response_id))
