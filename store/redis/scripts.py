"""The Redis store's Lua scripts: each backend operation is one script, so Redis runs it
as one atomic step (no other client's command lands inside it).

Every script gets the key prefix as ARGV[1] and the time (seconds) as ARGV[2]; the rest
of its arguments follow. A table `t` is kept in six keys: `t:body` (id → encoded
value), `t:lru` (id → recency tick; for `active`, the order jobs were registered in),
`t:exp` (id → expiry time, for tables with a TTL), `t:bytes` (the sum of the bodies'
lengths), `t:link` (id → `previous_response_id`) and `t:ver` (id → the tick it was
written at, for compare-and-set). Stored responses' items are indexed in `items`
per tenant and id: `ix:<tenant>\\n<item id>` is a sorted set of `<response id>\\n<place>`
scored by when the response was stored, each (response, id) once, and
`responses:itemkeys` holds each response's `[[tenant\\nitem id, place], ...]` so that
removing it costs its own size, whatever ids it repeats. Unfinished
jobs keep their owner in `active:owner` ("replica\\nepoch") and their cancel requests in
`active:cancel`; a replica's lease is `lease:<replica>` holding its epoch. The reasoning
echo cache is the table `echo`. A rate-limit counter's window is the key
`rate:<window secs>:<window start>:<counter>`, expiring after its window. The scripts of
stored values are here; those of jobs, leases, cancels and rate counters are in
`job_scripts.py`, on the same shared functions.
"""

from __future__ import annotations

PRELUDE = r"""
local B = ARGV[1]
local NOW = tonumber(ARGV[2])
local function k(name) return B .. name end
local function tick() return redis.call('INCR', k('tick')) end

local function live(t, id)
  if redis.call('HEXISTS', k(t .. ':body'), id) == 0 then return false end
  local expires = redis.call('ZSCORE', k(t .. ':exp'), id)
  return (not expires) or tonumber(expires) > NOW
end

local function touch(t, id)
  if t ~= 'active' then redis.call('ZADD', k(t .. ':lru'), 'XX', tick(), id) end
end

local function unindex(rid)
  local raw = redis.call('HGET', k('responses:itemkeys'), rid)
  if not raw then return end
  redis.call('HDEL', k('responses:itemkeys'), rid)
  for _, p in ipairs(cjson.decode(raw)) do
    redis.call('ZREM', k('ix:' .. p[1]), rid .. '\n' .. p[2])
  end
end

local function index(rid, items)
  local places = cjson.decode(items)
  if #places == 0 then return end
  local at = tick()
  for _, p in ipairs(places) do
    redis.call('ZADD', k('ix:' .. p[1]), at, rid .. '\n' .. p[2])
  end
  redis.call('HSET', k('responses:itemkeys'), rid, items)
end

local function remove(t, id)
  local body = redis.call('HGET', k(t .. ':body'), id)
  if not body then return false end
  redis.call('HDEL', k(t .. ':body'), id)
  redis.call('DECRBY', k(t .. ':bytes'), #body)
  redis.call('ZREM', k(t .. ':lru'), id)
  redis.call('ZREM', k(t .. ':exp'), id)
  redis.call('HDEL', k(t .. ':link'), id)
  redis.call('HDEL', k(t .. ':ver'), id)
  if t == 'responses' then unindex(id) end
  if t == 'active' then
    redis.call('HDEL', k('active:owner'), id)
    redis.call('SREM', k('active:cancel'), id)
  end
  return true
end

local function purge(t)
  for _, id in ipairs(redis.call('ZRANGEBYSCORE', k(t .. ':exp'), '-inf', NOW)) do
    remove(t, id)
  end
end

local function evict_one(t)
  local oldest = redis.call('ZRANGE', k(t .. ':lru'), 0, 0)
  return #oldest > 0 and remove(t, oldest[1])
end

local function count(t) return redis.call('HLEN', k(t .. ':body')) end
local function bytes(t) return tonumber(redis.call('GET', k(t .. ':bytes')) or '0') end

local function insert(t, id, body, ttl, link, items)
  local at = tick()
  redis.call('HSET', k(t .. ':body'), id, body)
  redis.call('INCRBY', k(t .. ':bytes'), #body)
  redis.call('ZADD', k(t .. ':lru'), at, id)
  redis.call('HSET', k(t .. ':ver'), id, at)
  if ttl > 0 then redis.call('ZADD', k(t .. ':exp'), NOW + ttl, id) end
  if link ~= '' then redis.call('HSET', k(t .. ':link'), id, link) end
  if t == 'responses' then index(id, items) end
end

-- Store under the table's limits: drop expired entries, replace the id, evict least
-- recently used entries until the body fits the byte budget, then until the entry cap
-- holds. The caller checked that the table is enabled and the body fits at all.
local function put(t, id, body, max_entries, max_bytes, ttl, link, items)
  purge(t)
  remove(t, id)
  while bytes(t) + #body > max_bytes and evict_one(t) do end
  insert(t, id, body, ttl, link, items)
  while count(t) > max_entries and evict_one(t) do end
end

-- A put spec is 8 arguments from `i`: table, max entries, max bytes, ttl, fits, body,
-- link, items. Stores it under `id` when it fits.
local function put_spec(i, id)
  if ARGV[i + 4] == '1' then
    put(ARGV[i], id, ARGV[i + 5], tonumber(ARGV[i + 1]), tonumber(ARGV[i + 2]),
        tonumber(ARGV[i + 3]), ARGV[i + 6], ARGV[i + 7])
  end
end

local function lease_live(owner)
  local split = string.find(owner, '\n', 1, true)
  if not split then return false end
  local replica, epoch = string.sub(owner, 1, split - 1), string.sub(owner, split + 1)
  return redis.call('GET', k('lease:' .. replica)) == epoch
end
"""


def script(body: str) -> str:
    """A script: the shared functions above, then `body`."""
    return PRELUDE + body


PUT = script(
    r"""
-- ARGV[3..]: table, id, body, max entries, max bytes, ttl, link, items
put(ARGV[3], ARGV[4], ARGV[5], tonumber(ARGV[6]), tonumber(ARGV[7]), tonumber(ARGV[8]),
    ARGV[9], ARGV[10])
return 1
"""
)

GET = script(
    r"""
-- ARGV[3]: id; ARGV[4..]: tables in order. Returns {table, body} or nil.
for i = 4, #ARGV do
  local t = ARGV[i]
  if live(t, ARGV[3]) then
    touch(t, ARGV[3])
    return {t, redis.call('HGET', k(t .. ':body'), ARGV[3])}
  end
end
return false
"""
)

GET_VERSIONED = script(
    r"""
-- ARGV[3]: table, ARGV[4]: id. Returns {body, version} of a live entry, or nil.
local t, id = ARGV[3], ARGV[4]
if not live(t, id) then return false end
touch(t, id)
return {redis.call('HGET', k(t .. ':body'), id), redis.call('HGET', k(t .. ':ver'), id)}
"""
)

PUT_IF_VERSION = script(
    r"""
-- ARGV[3..10] as PUT; ARGV[11]: the version read ('' for none). 1 if stored, 0 if the
-- entry changed since it was read.
local t, id = ARGV[3], ARGV[4]
local current = ''
if live(t, id) then current = redis.call('HGET', k(t .. ':ver'), id) end
if current ~= ARGV[11] then return 0 end
put(t, id, ARGV[5], tonumber(ARGV[6]), tonumber(ARGV[7]), tonumber(ARGV[8]), ARGV[9],
    ARGV[10])
return 1
"""
)

CHAIN = script(
    r"""
-- ARGV[3]: the newest id, ARGV[4]: most hops. Returns {missing id or '', bodies...}.
local out = {''}
local id, hops = ARGV[3], tonumber(ARGV[4])
while id and #out - 1 < hops do
  local t = nil
  if live('active', id) then t = 'active' elseif live('responses', id) then t = 'responses' end
  if not t then
    out[1] = id
    return out
  end
  touch(t, id)
  out[#out + 1] = redis.call('HGET', k(t .. ':body'), id)
  id = redis.call('HGET', k(t .. ':link'), id)
end
return out
"""
)

FIND_ITEMS = script(
    r"""
-- ARGV[3]: the tenant; ARGV[4..]: item ids, sorted. Returns {item id, response id,
-- place, body, ...} from the tenant's newest live stored response holding each; a
-- response's body is sent once ('' where an earlier one of the list carried it).
local tenant, out, sent = ARGV[3], {}, {}
for i = 4, #ARGV do
  local key, from = k('ix:' .. tenant .. '\n' .. ARGV[i]), 0
  local found = false
  while not found do
    local holders = redis.call('ZREVRANGE', key, from, from + 15)
    if #holders == 0 then break end
    for _, member in ipairs(holders) do
      local rid, place = string.match(member, '^(.*)\n(%d+)$')
      if live('responses', rid) then
        touch('responses', rid)
        out[#out + 1] = ARGV[i]
        out[#out + 1] = rid
        out[#out + 1] = place
        out[#out + 1] = sent[rid] and '' or redis.call('HGET', k('responses:body'), rid)
        sent[rid] = true
        found = true
        break
      end
    end
    from = from + 16
  end
end
return out
"""
)

REINDEX = script(
    r"""
-- ARGV[3]: a stored response's id, ARGV[4]: its items (as PUT's). Indexes it afresh
-- (the upgrade from the one-list-per-id index), if it is still stored.
if redis.call('HEXISTS', k('responses:body'), ARGV[3]) == 1 then
  unindex(ARGV[3])
  index(ARGV[3], ARGV[4])
end
return 1
"""
)

DELETE = script(
    r"""
-- ARGV[3]: table, ARGV[4]: id. An expired entry not yet dropped is already gone.
local t, id = ARGV[3], ARGV[4]
if not live(t, id) then return 0 end
remove(t, id)
return 1
"""
)

STATISTICS = script(
    r"""
local out = {}
for _, t in ipairs({'responses', 'conversations', 'ephemeral', 'active'}) do
  purge(t)
  out[#out + 1] = count(t)
  out[#out + 1] = bytes(t)
end
return out
"""
)

REMEMBER = script(
    r"""
-- ARGV[3]: key, ARGV[4]: trace, ARGV[5]: the echo byte budget.
local key, trace, budget = ARGV[3], ARGV[4], tonumber(ARGV[5])
if #trace > budget then return 0 end
remove('echo', key)
while bytes('echo') + #trace > budget and evict_one('echo') do end
insert('echo', key, trace, 0, '', '[]')
return 1
"""
)

RECALL = script(
    r"""
-- ARGV[3..]: keys. Returns {key, trace, ...} of those kept, each touched.
local out = {}
for i = 3, #ARGV do
  local trace = redis.call('HGET', k('echo:body'), ARGV[i])
  if trace then
    touch('echo', ARGV[i])
    out[#out + 1] = ARGV[i]
    out[#out + 1] = trace
  end
end
return out
"""
)
