-- ---------------------------------------------------------------------------
-- Keys (emq_core.c: emq_key_is, emq_base_has_hash_tag, emq_job_key_matches;
-- emq_keys.c: emq_check_queue_keys, emq_check_cluster_base).
-- ---------------------------------------------------------------------------
function emq.base_has_hash_tag(base)
    local open = base:find('{', 1, true)
    if open == nil then return false end
    local close = base:find('}', open + 1, true)
    return close ~= nil and close > open + 1
end

-- Cluster mode is asked of the server only for a base without a hash tag (never for the
-- client's own keys): INFO is the one way a script can tell.
local function cluster_enabled()
    return redis.call('INFO', 'cluster'):find('cluster_enabled:1', 1, true) ~= nil
end

-- keys[i] must be base .. suffix[i] (keys are argv positions).
function emq.check_queue_keys(argv, first, suffixes, base, mismatch)
    for i, suffix in ipairs(suffixes) do
        if argv[first + i - 1] ~= base .. suffix then emq.refuse(mismatch) end
    end
end

function emq.check_cluster_base(base)
    if not emq.base_has_hash_tag(base) and cluster_enabled() then emq.refuse(E.NO_HASH_TAG) end
end

function emq.check_queue(argv, first, suffixes, base, mismatch)
    emq.check_queue_keys(argv, first, suffixes, base, mismatch)
    emq.check_cluster_base(base)
end

-- <job> is <base>job:<id> for the <base> of <active>.
function emq.job_key_matches(active, job, id)
    local suffix = 'active'
    if #active < #suffix or active:sub(-#suffix) ~= suffix then return false end
    return job == active:sub(1, #active - #suffix) .. 'job:' .. id
end

-- ---------------------------------------------------------------------------
-- Opening keys.  A declared key was checked by the server before the script ran (ACL,
-- cluster routing); its type is read with TYPE.  A key derived from <base> at run time is
-- opened with emq.open_derived, which does what emq_open_derived does in C: the caller's
-- ACL first (redis.acl_check_cmd, which asks without running anything), then the first
-- touch, a call the server refuses for a key of a slot on the move, caught with
-- redis.pcall and answered with the module's words -- before anything is read or written.
-- ---------------------------------------------------------------------------
function emq.type(key)
    return redis.call('TYPE', key).ok
end

function emq.type_ok(t, want)
    return t == 'none' or t == want
end

-- What a verb does to a derived key (emq_keys.h: EMQ_DERIVED_*), as letters: r read its fields
-- (HGET; GET for a string), w create or change it (HSET; SET), d delete it (DEL), s the key is
-- a string (a request record), z a sorted set (a lane: <base>priority, <base>delayed).
emq.READ, emq.READ_WRITE, emq.CREATE, emq.DELETE, emq.READ_DELETE = 'r', 'rw', 'w', 'd', 'rd'
emq.RECORD, emq.RECORD_CREATE, emq.LANE = 'rws', 'ws', 'rwz'

-- The error a refused touch becomes: TRYAGAIN for a key this node does not serve as it
-- stands (an absent key of a slot on the move: Redis says "non local key", Valkey
-- "undeclared keys were accessed during rehashing"), the module's NOPERM for an ACL
-- refusal (Redis and Valkey word it differently too).  Anything else is raised again.
local function refusal_of(err)
    if err:find('non local key', 1, true) or err:find('TRYAGAIN', 1, true)
        or err:find('during rehashing', 1, true) then
        return E.TRYAGAIN
    end
    if err:find('NOPERM', 1, true) or err:find("can't access", 1, true)
        or err:find('ACL failure', 1, true) or err:find('No permissions', 1, true) then
        return E.NOPERM_DERIVED
    end
    error({ err = err }, 0)
end

-- May the caller do `access` to the key?  Asked as the module asks it (emq_acl_may): could the
-- caller run the core commands that do the same -- HGET, HSET, DEL (GET and SET for a string)
-- -- checked by the server selector by selector (one selector must allow both the command and
-- the key), before the key is touched at all.  A script's every call is checked by the server
-- too, so a write is asked as each command a verb may apply to such a key (HSET, HINCRBY,
-- HDEL, PEXPIREAT, PERSIST, DEL; SET, PEXPIREAT for a string): a call refused after the first
-- write would leave the verb half applied.  (The module, whose writes the server does not
-- check, asks HSET, SET, DEL alone: docs/reference/acl.md.)
local function has(access, letter)
    return access:find(letter, 1, true) ~= nil
end

local HASH_WRITES = {
    { 'HSET', 'f', 'v' }, { 'HINCRBY', 'f', '1' }, { 'HDEL', 'f' }, { 'PEXPIREAT', '0' }, { 'PERSIST' }, { 'DEL' },
}
local STRING_WRITES = { { 'SET', 'v' }, { 'PEXPIREAT', '0' } }
local STRING_READS = { { 'GET' }, { 'STRLEN' }, { 'GETRANGE', '0', '0' } } -- a claim's record, read a window at a time
local HASH_READS = { { 'HGET', 'f' } }
local ZSET_READS = { { 'ZSCORE', 'm' }, { 'ZRANGE', '0', '0' }, { 'ZCARD' } }
local ZSET_WRITES = { { 'ZADD', '0', 'm' }, { 'ZREM', 'm' } }

local function may_all(name, commands)
    for _, c in ipairs(commands) do
        if not redis.acl_check_cmd(c[1], name, unpack(c, 2)) then return false end
    end
    return true
end

local function may(name, access)
    local reads, writes = HASH_READS, HASH_WRITES
    if has(access, 's') then
        reads, writes = STRING_READS, STRING_WRITES
    elseif has(access, 'z') then
        reads, writes = ZSET_READS, ZSET_WRITES
    end
    if has(access, 'r') and not may_all(name, reads) then return false end
    if has(access, 'w') and not may_all(name, writes) then return false end
    if has(access, 'd') and not redis.acl_check_cmd('DEL', name) then return false end
    return true
end
emq.may = may

-- Touch a derived key for `access` (emq.READ, emq.READ_WRITE or emq.CREATE) without raising:
-- its type, or nil and the module's refusal.
function emq.touch(name, access)
    if not may(name, access) then return nil, E.NOPERM_DERIVED end
    local t = redis.pcall('TYPE', name)
    if t.err then return nil, refusal_of(t.err) end
    -- An absent key may be absent only from this node: its slot may be on the move, and on
    -- the importing node (a call redirected there with ASKING) a single-key call is served
    -- whether or not the key already arrived.  A call naming it beside another key of the
    -- slot is refused (TRYAGAIN) while any of them is missing there, as the module answers.
    -- Asked only for an absent key, so the common path costs nothing (emq_absent_key_is_final).
    if t.ok == 'none' and KEYS[1] and KEYS[1] ~= name then
        local e = redis.pcall('EXISTS', KEYS[1], name)
        if type(e) == 'table' and e.err then return nil, refusal_of(e.err) end
    end
    return t.ok, nil
end

-- Open a derived key: its type, after the checks (emq_open_derived).  A key given in KEYS
-- (`declared`, made by emq.run) was checked by the server before the Lua ran, for reading
-- and writing (EVAL's and FCALL's keys are read-write), and routed the call.
function emq.open_derived(name, access)
    if declared[name] then return emq.type(name) end
    local t, refused = emq.touch(name, access)
    if refused then emq.refuse(refused) end
    return t
end

-- A field of a hash key, or nil when the key is not a hash or has no such field (emq_hget).
function emq.hget(key, ktype, field)
    if ktype ~= 'hash' then return nil end
    local v = redis.call('HGET', key, field)
    return v or nil
end

function emq.hexists(key, ktype, field)
    return ktype == 'hash' and redis.call('HEXISTS', key, field) == 1
end

-- ---------------------------------------------------------------------------
-- The queue's settings (emq_keys.c: emq_read_meta).
-- ---------------------------------------------------------------------------
emq.DEFAULT_DONE_TTL_MS = 3600000
emq.DEFAULT_CANCELLED_TTL_MS = 86400000
emq.DEFAULT_DEAD_TTL_MS = -1

function emq.read_meta(base)
    local meta = {
        paused = false,
        deps = false,
        done_ttl = emq.DEFAULT_DONE_TTL_MS,
        cancelled_ttl = emq.DEFAULT_CANCELLED_TTL_MS,
        dead_ttl = emq.DEFAULT_DEAD_TTL_MS,
    }
    local name = base .. 'meta'
    local t = emq.open_derived(name, emq.READ)
    if not emq.type_ok(t, 'hash') then emq.refuse(E.WRONGTYPE) end
    if t == 'hash' then
        local v = redis.call('HMGET', name, 'paused', 'done_ttl_ms', 'cancelled_ttl_ms', 'dead_ttl_ms', 'deps')
        meta.paused = v[1] ~= false
        meta.deps = v[5] ~= false
        if v[2] then meta.done_ttl = emq.parse_retention(v[2], E.META_NOT_INTEGER) end
        if v[3] then meta.cancelled_ttl = emq.parse_retention(v[3], E.META_NOT_INTEGER) end
        if v[4] then meta.dead_ttl = emq.parse_retention(v[4], E.META_NOT_INTEGER) end
    end
    return meta
end

-- A finished row's retention (emq_effects.c: emq_fx_retain): kept (-1), deleted at once
-- (0), or expiring at now + ttl, absolute (PEXPIREAT), so a replica and the AOF expire it
-- when the master does.  now + ttl may pass 2^53: added exactly.
function emq.retain(row, now, ttl)
    if ttl < 0 then return end
    if ttl == 0 then
        redis.call('DEL', row)
        return
    end
    redis.call('PEXPIREAT', row, emq.dec_add(int(now), int(ttl)))
end

-- ---------------------------------------------------------------------------
-- The fence (emq_core.c: emq_holder, emq_holder_error, emq_is_retry_of,
-- emq_closed_route; emq_keys.c: emq_check_holder_or_retry).
-- ---------------------------------------------------------------------------
emq.HOLDER_OK, emq.HOLDER_GONE, emq.HOLDER_STALE_TOKEN, emq.HOLDER_NOT_ACTIVE = 'ok', 'gone', 'stale', 'inactive'
emq.TO_PENDING, emq.TO_DEAD, emq.TO_CANCELLED = 'pending', 'dead', 'cancelled'

local STALE = { extend = E.STALE_EXTEND, complete = E.STALE_COMPLETE, fail = E.STALE_FAIL, release = E.STALE_RELEASE }

-- The error for a holder verdict that is neither OK nor GONE; nil for those two.
function emq.holder_error(verb, holder)
    if holder == emq.HOLDER_STALE_TOKEN then return STALE[verb] end
    if holder == emq.HOLDER_NOT_ACTIVE then return E.NOT_ACTIVE end
    return nil
end

-- The holder verdict for <id> and <token> (the row's token byte for byte, and membership of
-- <active>), and for NOT_ACTIVE whether this is the retry of `verb` whose reply was lost:
-- returns holder, retry, route (where the first call sent the job).
function emq.check_holder_or_retry(active, row, rtype, id, token, verb)
    local current = emq.hget(row, rtype, 'token')
    local holder
    if current == nil then
        holder = emq.HOLDER_GONE
    elseif current ~= token then
        holder = emq.HOLDER_STALE_TOKEN
    elseif redis.call('ZSCORE', active, id) then
        holder = emq.HOLDER_OK
    else
        holder = emq.HOLDER_NOT_ACTIVE
    end
    local retry, route = false, emq.TO_PENDING
    if holder == emq.HOLDER_NOT_ACTIVE then
        local closed_by = emq.hget(row, rtype, 'closed_by')
        if closed_by and (closed_by == verb or closed_by:sub(1, #verb + 1) == verb .. ':') then
            retry = true
            local where = closed_by:match('^[^:]*:(.*)$')
            if where == 'dead' then
                route = emq.TO_DEAD
            elseif where == 'cancelled' then
                route = emq.TO_CANCELLED
            end
        end
    end
    return holder, retry, route
end

-- 1 when a row's state says the job is over (emq_state_is_finished).
function emq.state_is_finished(state)
    return state == 'done' or state == 'dead' or state == 'cancelled'
end

-- May RETRY move a row in this state back to pending?  nil, or the EMQSTATE refusal.
function emq.retry_check(state)
    if state == nil then return E.STATE_UNKNOWN end
    if state == 'dead' or state == 'cancelled' then return nil end
    if state == 'pending' then return E.STATE_PENDING end
    if state == 'active' then return E.STATE_ACTIVE end
    if state == 'done' then return E.STATE_DONE end
    return E.STATE_UNKNOWN
end

-- ---------------------------------------------------------------------------
-- Sorted sets.
-- ---------------------------------------------------------------------------

-- Up to `limit` members scored at or below `max` (a score argument: a number's decimal or
-- '+inf'), lowest first (emq_zset_head).
function emq.zset_head(set, max, limit)
    if limit < 1 then return {} end
    return redis.call('ZRANGE', set, '-inf', max, 'BYSCORE', 'LIMIT', 0, emq.limit_arg(limit))
end

-- ---------------------------------------------------------------------------
-- Past maxmemory?  The module asks its context (REDISMODULE_CTX_FLAGS_OOM); a script reads
-- what that flag is made of: the memory in use, less what eviction does not count, above
-- maxmemory.  Asked only where a verb that is not deny-oom grows memory (a checkpoint's state
-- or progress, a COMPLETE's result).
-- ---------------------------------------------------------------------------
function emq.past_maxmemory()
    local info = redis.call('INFO', 'memory')
    local function field(name)
        return tonumber(info:match('\n' .. name .. ':(%d+)') or '0')
    end
    local max = field('maxmemory')
    if max == 0 then return false end
    return field('used_memory') - field('mem_not_counted_for_evict') > max
end

-- The server's settings a script cannot read, as the client gives them: emq.max-payload-bytes and
-- emq.max-result-bytes (module default 1 MiB), within the module's range (0 to 16 MiB).
function emq.max_bytes(setting)
    local v = tonumber(setting)
    if v == nil or v < 0 then v = 1048576 end
    return math.min(math.floor(v), 16777216)
end

