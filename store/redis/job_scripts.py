"""The Redis store's scripts of background jobs, replica leases, cancels and rate
counters; the key layout, the shared functions and the arguments every script takes are
those of `store/redis/scripts.py`."""

from __future__ import annotations

from mlxcel.store.redis.scripts import script

REGISTER_JOB = script(
    r"""
-- ARGV[3]: id, ARGV[4]: body, ARGV[5]: link, ARGV[6]: owner
remove('active', ARGV[3])
insert('active', ARGV[3], ARGV[4], 0, ARGV[5], '[]')
redis.call('HSET', k('active:owner'), ARGV[3], ARGV[6])
return 1
"""
)

UPDATE_JOB = script(
    r"""
-- ARGV[3]: id, ARGV[4]: body, ARGV[5]: owner. 0 when fenced out.
local id = ARGV[3]
if redis.call('HGET', k('active:owner'), id) ~= ARGV[5] then return 0 end
local old = redis.call('HGET', k('active:body'), id)
redis.call('HSET', k('active:body'), id, ARGV[4])
redis.call('INCRBY', k('active:bytes'), #ARGV[4] - #old)
return 1
"""
)

FINISH_JOB = script(
    r"""
-- ARGV[3]: id, ARGV[4]: owner, ARGV[5..12]: the put spec of the final object.
local id = ARGV[3]
if redis.call('HGET', k('active:owner'), id) ~= ARGV[4] then return 0 end
put_spec(5, id)
remove('active', id)
return 1
"""
)

DEAD_JOBS = script(
    r"""
-- ARGV[3]: the caller's owner. Returns {id, owner, body, ...} of the unfinished jobs
-- whose owner is neither the caller nor live, in the order they were registered.
local out = {}
for _, id in ipairs(redis.call('ZRANGE', k('active:lru'), 0, -1)) do
  local owner = redis.call('HGET', k('active:owner'), id)
  if owner and owner ~= ARGV[3] and not lease_live(owner) then
    out[#out + 1] = id
    out[#out + 1] = owner
    out[#out + 1] = redis.call('HGET', k('active:body'), id)
  end
end
return out
"""
)

REAP_JOB = script(
    r"""
-- ARGV[3]: id, ARGV[4]: the dead owner read, ARGV[5..12]: the put spec of the failed end,
-- ARGV[13..20]: of the cancelled end. 1 if this call ended the job (exactly one does).
local id, owner = ARGV[3], ARGV[4]
if redis.call('HGET', k('active:owner'), id) ~= owner or lease_live(owner) then return 0 end
if redis.call('SISMEMBER', k('active:cancel'), id) == 1 then put_spec(13, id) else put_spec(5, id) end
remove('active', id)
return 1
"""
)

REQUEST_CANCEL = script(
    r"""
-- ARGV[3]: id. Flags the job and tells its owner's replica; returns the owner or nil.
local owner = redis.call('HGET', k('active:owner'), ARGV[3])
if not owner then return false end
redis.call('SADD', k('active:cancel'), ARGV[3])
local replica = string.sub(owner, 1, (string.find(owner, '\n', 1, true) or 0) - 1)
redis.call('PUBLISH', k('cancel:' .. replica), ARGV[3])
return owner
"""
)

CANCELS_FOR = script(
    r"""
-- ARGV[3]: an owner. The ids of its unfinished jobs asked to cancel.
local out = {}
for _, id in ipairs(redis.call('SMEMBERS', k('active:cancel'))) do
  if redis.call('HGET', k('active:owner'), id) == ARGV[3] then out[#out + 1] = id end
end
return out
"""
)

RENEW_LEASE = script(
    r"""
-- ARGV[3]: replica, ARGV[4]: epoch, ARGV[5]: lease in ms, ARGV[6]: '1' to take it.
-- 1 when the replica holds its lease (for another lease time), 0 when it lost it.
local key = k('lease:' .. ARGV[3])
if ARGV[6] == '1' then
  redis.call('SET', key, ARGV[4], 'PX', ARGV[5])
  return 1
end
if redis.call('GET', key) ~= ARGV[4] then return 0 end
redis.call('PEXPIRE', key, ARGV[5])
return 1
"""
)

RELEASE_LEASE = script(
    r"""
-- ARGV[3]: replica, ARGV[4]: epoch.
local key = k('lease:' .. ARGV[3])
if redis.call('GET', key) == ARGV[4] then redis.call('DEL', key) end
return 1
"""
)

CHARGE = script(
    r"""
-- ARGV[3]: the window's key, ARGV[4]: amount (below 0: returned, never under 0),
-- ARGV[5]: limit (0: none), ARGV[6]: the key's life in ms. Returns {1 if allowed (and
-- added) else 0, the count after}.
local key, amount, limit = k(ARGV[3]), tonumber(ARGV[4]), tonumber(ARGV[5])
local used = tonumber(redis.call('GET', key) or '0')
if limit > 0 and used >= limit then return {0, used} end
if amount > 0 then
  used = redis.call('INCRBY', key, amount)
  redis.call('PEXPIRE', key, ARGV[6])
elseif amount < 0 and used > 0 then
  used = math.max(0, used + amount)
  redis.call('SET', key, used, 'KEEPTTL')
end
return {1, used}
"""
)
