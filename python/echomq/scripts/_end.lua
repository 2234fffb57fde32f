-- ---------------------------------------------------------------------------
-- The two hooks (emq_end.c): a job leaves <active>; a job ends.  Each a prepare (reads and
-- checks: may refuse) and an apply (writes).  Adding a step: beside the ones below.
-- ---------------------------------------------------------------------------
-- Step (emq_group.c): the job's group, if it has one, counts one active job less.
function emq.left_active_prepare(base, id)
    local row = base .. 'job:' .. id
    local group = emq.hget(row, emq.type(row), 'group')
    if group == nil then return end
    local name = base .. 'group:' .. group
    emq.group_check(name, -1)
    emq.group_settle_check(base, group)
    group_left[#group_left + 1] = { id = id, name = name, group = group, base = base }
end

function emq.left_active_apply(base, id)
    local n = #group_left
    for k = 0, n - 1 do
        local i = (group_next - 1 + k) % n + 1
        local g = group_left[i]
        if not g.applied and g.id == id then
            g.applied = true
            group_next = i + 1
            emq.group_write(base, g.group, -1)
            if not group_defer then emq.group_settle(base, g.group) end -- a slot freed
            return
        end
    end
end

-- emq_groups_settle_deferred: left_active_apply settles nothing from defer_settle() on; this
-- settles what it left, in the order met.
function emq.defer_settle() group_defer = true end

function emq.settle_deferred(base)
    for _, g in ipairs(group_left) do
        if g.applied then emq.group_settle(base, g.group) end
    end
end

-- Step (emq_unique.c: emq_unique_end_prepare): a unique key the job holds is released -- an UNTIL
-- key at any end, a FOR window only when the row goes.  The row is the caller's, checked by it.
-- `no_deps`: the caller read <base>meta and the queue never had a dependency (its `deps` absent).
function emq.ended_prepare(base, id, how, already, no_deps)
    emq.unique_end_prepare(base, id, how)
    -- Step (emq_deps.c): the job's waiters are resolved; a waiting job leaves its waiter sets.
    if not no_deps then emq.deps_end_prepare(base, id, how, already) end
end

function emq.unique_end_prepare(base, id, how)
    local row = base .. 'job:' .. id
    local key = emq.hget(row, emq.type(row), 'unique')
    if key == nil then return end
    local name = base .. 'unique:' .. key
    if emq.open_derived(name, 'rds') ~= 'string' or redis.call('GET', name) ~= id then return end
    if how ~= 'deleted' and redis.call('PTTL', name) >= 0 then return end
    unique_release[id] = name
end

-- Step: the announcement on <base>done:<id> (SPUBLISH: the scripts need Redis 7.0, which has it).
-- The module publishes whatever the caller's channel permissions; a script publishes as the
-- caller, so a caller who may not publish there ends the job unannounced.
function emq.ended_apply(base, id, how, already)
    local name = unique_release[id]
    if name then
        unique_release[id] = nil
        if redis.call('EXISTS', name) == 1 then redis.call('DEL', name) end
    end
    emq.deps_end_apply(base, id, how, already)
    if already then return end
    local channel = base .. 'done:' .. id
    if redis.acl_check_cmd('SPUBLISH', channel, id) then redis.call('SPUBLISH', channel, id) end
end

-- ---------------------------------------------------------------------------
-- Groups (emq_group.c): a job's group (GROUP <g>) and <base>group:<g>'s `active`, the count of
-- its jobs in <active>, checked at prepare and written at apply from the value as it stands
-- then (absolute HSET, HDEL at 0), so that one call's writes see each other.
-- ---------------------------------------------------------------------------
local GROUP_MAX, GROUP_ACTIVE_MAX = 128, '9007199254740992'

-- emq_parse_group: 1 to 128 bytes of letters, digits and -_.:@.
function emq.parse_group(s)
    if #s == 0 or #s > GROUP_MAX or s:find('[^%w%-_%.:@]') then emq.refuse(E.GROUP) end
    return s
end

-- emq_parse_group_active: absent is 0, else a canonical integer from 0 to 2^53.
local function group_active(v)
    if v == nil then return 0 end
    local n = emq.parse_ll(v)
    if n == nil or n < 0 or emq.dec_cmp(v, GROUP_ACTIVE_MAX) > 0 then return nil end
    return n
end

-- check_key: the caller may read and write it, a hash (or absent), a count `delta` may move.
function emq.group_check(name, delta)
    local t = emq.open_derived(name, emq.READ_WRITE)
    if not emq.type_ok(t, 'hash') then emq.refuse(E.WRONGTYPE) end
    local n = group_active(emq.hget(name, t, 'active'))
    if n == nil then emq.refuse(E.GROUP_FIELD) end
    if delta > 0 and n > 9007199254740992 - delta then emq.refuse(E.OVERFLOW) end
end

-- The count, or refused (EMQ.GROUPLIMIT's read).
function emq.group_active_read(name, t)
    local n = group_active(emq.hget(name, t, 'active'))
    if n == nil then emq.refuse(E.GROUP_FIELD) end
    return n
end

-- emq_group_index_check / emq_group_index_sync: <base>groupset, the names of the groups whose hash
-- exists (a sorted set, every score 0); `existed` whether the hash existed before the write.
function emq.group_index_check(base)
    if not emq.type_ok(emq.open_derived(base .. 'groupset', emq.LANE), 'zset') then emq.refuse(E.WRONGTYPE) end
end

function emq.group_index_sync(base, group, existed)
    local exists = redis.call('EXISTS', base .. 'group:' .. group) == 1
    if exists == existed then return end
    local index = base .. 'groupset'
    if not emq.type_ok(emq.type(index), 'zset') then return end
    if exists then redis.call('ZADD', index, 0, group) else redis.call('ZREM', index, group) end
end

-- write_count: the count as it stands, moved by `delta`, never below 0, written back.
function emq.group_write(base, group, delta)
    local name = base .. 'group:' .. group
    local t = emq.type(name)
    local v = emq.hget(name, t, 'active')
    local n = group_active(v) or 0
    local next = math.max(0, n + delta)
    if next > 0 then
        redis.call('HSET', name, 'active', emq.int(next))
    elseif v then
        redis.call('HDEL', name, 'active')
    end
    emq.group_index_sync(base, group, t == 'hash')
end

-- Caps (emq_group.h): `max` and `paused` of <base>group:<g>; a group is in the ring exactly when
-- emq.group_claimable says so.
local GROUP_CAP_MAX = 1000000000
emq.NO_CAP = 1e18 -- above every cap (1 to 1e9)

-- emq_parse_group_max: MAX's value, an integer from 1 to 1,000,000,000.
function emq.parse_group_max(v)
    local n = emq.parse_ll(v)
    if n == nil or n < 1 or n > GROUP_CAP_MAX then emq.refuse(E.GROUP_MAX) end
    return n
end

-- emq_group_claimable: its lane holds a job, it is not paused, it is below its cap.
function emq.group_claimable(has_job, paused, active, cap)
    return has_job and not paused and active < cap
end

-- emq_group_default_cap: <base>meta's `group_max`, the cap of every group without its own
-- (emq.NO_CAP when absent; nil when bad).
local function default_cap(base)
    local meta = base .. 'meta'
    local v = emq.hget(meta, emq.type(meta), 'group_max')
    if v == nil then return emq.NO_CAP end
    local n = emq.parse_ll(v)
    if n == nil or n < 1 or n > GROUP_CAP_MAX then return nil end
    return n
end

function emq.group_default_cap(base)
    local cap = default_cap(base)
    if cap == nil then emq.refuse(E.GROUP_DEFAULT_FIELD) end
    return cap
end

-- emq_group_caps_read: `active` (a broken one reads 0: the claim and the hook refuse it) and
-- the cap: its own `max`, else the queue's `group_max`, else emq.NO_CAP (nil and the error when
-- bad).
local function caps(base, name, htype)
    if htype ~= 'hash' and htype ~= 'none' then return 0, emq.NO_CAP end
    local active = htype == 'hash' and group_active(emq.hget(name, htype, 'active')) or 0
    local v = htype == 'hash' and emq.hget(name, htype, 'max') or nil
    if v == nil then
        local cap = default_cap(base)
        return active, cap, cap == nil and E.GROUP_DEFAULT_FIELD or nil
    end
    local n = emq.parse_ll(v)
    if n == nil or n < 1 or n > GROUP_CAP_MAX then return active, nil, E.GROUP_MAX_FIELD end
    return active, n
end

function emq.group_caps_read(name, htype, base)
    local active, cap, err = caps(base, name, htype)
    if cap == nil then emq.refuse(err) end
    return active, cap
end

-- emq_group_settle_check: the lane, the ring and <base>meta, checked for emq.group_settle.
function emq.group_settle_check(base, group)
    for _, k in ipairs({ { base .. 'g:' .. group, emq.LANE, 'zset' }, { base .. 'groups', emq.READ_WRITE, 'list' },
        { base .. 'meta', emq.READ_WRITE, 'hash' }, { base .. 'groupset', emq.LANE, 'zset' } }) do
        if not emq.type_ok(emq.open_derived(k[1], k[2]), k[3]) then emq.refuse(E.WRONGTYPE) end
    end
end

-- emq_group_settle: the group enters the ring's tail if it may and is not in it, read as it stands.
function emq.group_settle(base, group)
    local name = base .. 'group:' .. group
    local htype = emq.type(name)
    if htype ~= 'hash' and htype ~= 'none' then return end
    if emq.hexists(name, htype, 'ring') then return end
    local active, cap = caps(base, name, htype)
    if cap == nil then return end
    local lane = base .. 'g:' .. group
    local has = emq.type(lane) == 'zset'
    if not emq.group_claimable(has, emq.hexists(name, htype, 'paused'), active, cap) then return end
    local ring = base .. 'groups'
    local rtype = emq.type(ring)
    if rtype == 'none' then
        redis.call('RPUSH', ring, '', group) -- a new ring starts with the empty name
    elseif rtype == 'list' then
        redis.call('RPUSH', ring, group)
    else
        return
    end
    redis.call('HSET', name, 'ring', '1')
    emq.group_index_sync(base, group, htype == 'hash')
    local meta = base .. 'meta'
    local mtype = emq.type(meta)
    if (mtype == 'hash' or mtype == 'none') and not emq.hexists(meta, mtype, 'ring') then
        redis.call('HSET', meta, 'ring', '1')
    end
end

-- emq_groups_claimed: the jobs a claim takes, summed per group in the order met (a list).
function emq.groups_claimed(base, jobs)
    local sums, by_name = {}, {}
    for _, j in ipairs(jobs) do
        local group = redis.call('HGET', j.row, 'group')
        if group then
            local name = base .. 'group:' .. group
            local s = by_name[name]
            if s then
                s.delta = s.delta + 1
            else
                emq.group_check(name, 1)
                emq.group_index_check(base)
                s = { name = name, group = group, delta = 1 }
                by_name[name] = s
                sums[#sums + 1] = s
            end
        end
    end
    return sums
end

function emq.groups_claimed_apply(base, sums)
    for _, s in ipairs(sums) do emq.group_write(base, s.group, s.delta) end
end

-- ---------------------------------------------------------------------------
-- Unique jobs (emq_unique.c): ENQUEUE ... UNIQUE <key> [FOR <ms> | UNTIL done] [REPLACE].
-- ---------------------------------------------------------------------------
emq.UNIQUE_TAKE, emq.UNIQUE_HELD, emq.UNIQUE_REPLACE = 0, 1, 2
local UNIQUE_KEY_MAX, UNIQUE_FOR_MAX = 512, 2592000000

-- emq_unique_option: the option at argv[i] if it is UNIQUE, FOR, UNTIL or REPLACE, into `u`: how
-- many arguments it takes (2, or 1 for REPLACE); 0 when it is none of them.  `u` nil
-- (ENQUEUEMANY): UNIQUE is refused, the others are not its options.
function emq.unique_option(u, argv, i, argc)
    local opt = argv[i]
    local unique, replace = emq.option_is(opt, 'UNIQUE'), emq.option_is(opt, 'REPLACE')
    local for_, until_ = emq.option_is(opt, 'FOR'), emq.option_is(opt, 'UNTIL')
    if u == nil then
        if unique then emq.refuse(E.UNIQUE_MANY) end
        return 0
    end
    if replace then
        if u.replace then emq.refuse(E.SYNTAX) end
        u.replace = true
        return 1
    end
    if not unique and not for_ and not until_ then return 0 end
    if i + 1 >= argc then emq.refuse(E.SYNTAX) end
    local val = argv[i + 1]
    if unique then
        if u.key then emq.refuse(E.SYNTAX) end
        if #val == 0 or #val > UNIQUE_KEY_MAX then emq.refuse(E.UNIQUE_KEY) end
        u.key = val
    else
        local again, other
        if for_ then again, other = u.for_ms ~= nil, u.until_done else again, other = u.until_done, u.for_ms ~= nil end
        if again then emq.refuse(E.SYNTAX) end
        if other then emq.refuse(E.UNIQUE_FOR_AND_UNTIL) end
        if for_ then
            local ms = emq.parse_ll(val)
            if ms == nil or ms < 1 or ms > UNIQUE_FOR_MAX then emq.refuse(E.UNIQUE_FOR) end
            u.for_ms = ms
        else
            if not emq.option_is(val, 'DONE') then emq.refuse(E.UNIQUE_UNTIL) end
            u.until_done = true
        end
    end
    return 2
end

-- emq_unique_options_check: FOR, UNTIL and REPLACE need UNIQUE.
function emq.unique_options_check(u)
    if u.key == nil and (u.replace or u.for_ms or u.until_done) then emq.refuse(E.UNIQUE_NEEDED) end
end

-- emq_unique_decide: free or an orphan's (TAKE), held (HELD), or held by a pending job with
-- REPLACE given (REPLACE); and the holder.  Without UNIQUE: TAKE.
function emq.unique_decide(base, u)
    if u.key == nil then return emq.UNIQUE_TAKE end
    local name = base .. 'unique:' .. u.key
    local t = emq.open_derived(name, emq.RECORD)
    if not emq.type_ok(t, 'string') then emq.refuse(E.WRONGTYPE) end
    if t == 'none' then return emq.UNIQUE_TAKE end
    local holder = redis.call('GET', name)
    local window = redis.call('PTTL', name) >= 0
    local row = base .. 'job:' .. holder
    local rtype = emq.open_derived(row, u.replace and emq.READ_WRITE or emq.READ)
    local state = emq.hget(row, rtype, 'state')
    if not window and state ~= 'pending' and state ~= 'active' and state ~= 'waiting' then
        return emq.UNIQUE_TAKE -- an orphan
    end
    if u.replace and state == 'pending' then return emq.UNIQUE_REPLACE, holder end
    return emq.UNIQUE_HELD, holder
end

-- emq_unique_take: the key names `id` (SET, and PEXPIREAT now + FOR).
function emq.unique_take(base, u, id, now)
    if u.key == nil then return end
    local name = base .. 'unique:' .. u.key
    redis.call('SET', name, id)
    if u.for_ms then redis.call('PEXPIREAT', name, int(now + u.for_ms)) end
end

-- emq_unique_replace: the pending holder's payload becomes `payload` (its old pieces dropped).
function emq.unique_replace(base, holder, payload)
    local row = base .. 'job:' .. holder
    local fields = {}
    local n = emq.pieces(fields, 'payload', payload)
    emq.drop_pieces(row, 'hash', 'payload', n)
    redis.call('HSET', row, unpack(fields))
end

return emq
