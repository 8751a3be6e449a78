"""The Redis store's pending webhook deliveries (`store/deliveries.py`), shared by the
replicas: a hash of bodies and a sorted set of due times under `{PREFIX}:`, each
operation one script, so a claim by one replica is never also another's."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from mlxcel.store.deliveries import MAX_PENDING, Delivery, decode_delivery, encode_delivery

Run = Callable[..., Awaitable[Any]]
"""The backend's `_run`: one script, given the key base and the time before its args."""

_PRELUDE = r"""
local B = ARGV[1]
local now = tonumber(ARGV[2])
local bodies, due = B .. 'webhooks:body', B .. 'webhooks:due'
"""

ADD = (
    _PRELUDE
    + r"""
-- ARGV[3]: response id, ARGV[4]: body, ARGV[5]: delay, ARGV[6]: most kept, ARGV[7]: '1'
-- to settle (only replace one kept). 0 when nothing was written.
local id = ARGV[3]
if redis.call('HEXISTS', bodies, id) == 0
    and (ARGV[7] == '1' or redis.call('HLEN', bodies) >= tonumber(ARGV[6])) then
  return 0
end
redis.call('HSET', bodies, id, ARGV[4])
redis.call('ZADD', due, now + tonumber(ARGV[5]), id)
return 1
"""
)

CLAIM = (
    _PRELUDE
    + r"""
-- ARGV[3]: most taken, ARGV[4]: lease. The bodies taken, earliest due first.
local out = {}
for _, id in ipairs(redis.call('ZRANGEBYSCORE', due, '-inf', now, 'LIMIT', 0, ARGV[3])) do
  local body = redis.call('HGET', bodies, id)
  if body then
    redis.call('ZADD', due, now + tonumber(ARGV[4]), id)
    out[#out + 1] = body
  else
    redis.call('ZREM', due, id)
  end
end
return out
"""
)

DROP = (
    _PRELUDE
    + r"""
-- ARGV[3]: response id.
redis.call('ZREM', due, ARGV[3])
return redis.call('HDEL', bodies, ARGV[3])
"""
)


class RedisDeliveries:
    """`Deliveries` in the shared Redis store."""

    def __init__(self, run: Run) -> None:
        self._run = run

    async def add(self, delivery: Delivery, delay_secs: float, *, settle: bool = False) -> bool:
        body = encode_delivery(delivery)
        delay = repr(float(delay_secs))
        args = (delivery.response_id, body, delay, str(MAX_PENDING), "1" if settle else "0")
        return bool(await self._run(ADD, *args))

    async def claim(self, limit: int, lease_secs: float) -> tuple[Delivery, ...]:
        bodies = await self._run(CLAIM, str(limit), repr(float(lease_secs)))
        return tuple(decode_delivery(body) for body in bodies)

    async def drop(self, response_id: str) -> bool:
        return bool(await self._run(DROP, response_id))
