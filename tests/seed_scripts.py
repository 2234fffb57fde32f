"""The seed's two Lua scripts (seed/cancellation-and-checkpoints.txt).

EXTEND_LUA carries the one documented fix (DESIGN.md): an id that is no
longer a member of the active set is refused as stale instead of re-added.
EXTEND_LUA_ORIGINAL is the seed verbatim in behaviour, kept for the
benchmark's like-for-like comparison.  Used by the differential test and by
bench/.
"""

from __future__ import annotations

EXTEND_LUA_ORIGINAL = """
local att = redis.call('HGET', KEYS[2], 'attempts')
if not att then return -1 end
if att ~= ARGV[2] then
  return redis.error_reply('EMQSTALE extend token mismatch')
end
local t = redis.call('TIME')
local now = t[1] * 1000 + math.floor(t[2] / 1000)
redis.call('ZADD', KEYS[1], now + tonumber(ARGV[3]), ARGV[1])
return 1
"""

EXTEND_LUA = """
local att = redis.call('HGET', KEYS[2], 'attempts')
if not att then return -1 end
if att ~= ARGV[2] then
  return redis.error_reply('EMQSTALE extend token mismatch')
end
if not redis.call('ZSCORE', KEYS[1], ARGV[1]) then
  return redis.error_reply('EMQSTALE job is no longer active')
end
local t = redis.call('TIME')
local now = t[1] * 1000 + math.floor(t[2] / 1000)
redis.call('ZADD', KEYS[1], now + tonumber(ARGV[3]), ARGV[1])
return 1
"""

SWEEP_LUA = """
local p = ARGV[1]
local maxst = tonumber(ARGV[2])
local lim = tonumber(ARGV[3])
local t = redis.call('TIME')
local now = t[1] * 1000 + math.floor(t[2] / 1000)
local exp = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', now, 'LIMIT', 0, lim)
local recovered = {}
local dead = {}
for _, id in ipairs(exp) do
  redis.call('ZREM', KEYS[1], id)
  local jk = p .. 'job:' .. id
  local st = redis.call('HINCRBY', jk, 'stalled', 1)
  if st >= maxst then
    redis.call('HSET', jk, 'state', 'dead')
    redis.call('HSET', jk, 'last_error', 'stalled')
    redis.call('ZADD', KEYS[3], 0, id)
    redis.call('HINCRBY', p .. 'metrics:failed', 'count', 1)
    table.insert(dead, id)
  else
    redis.call('ZADD', KEYS[2], 0, id)
    redis.call('HSET', jk, 'state', 'pending')
    table.insert(recovered, id)
  end
end
return {recovered, dead}
"""
