#!lua flags=allow-oom
-- EMQ.GROUPLIMIT <pending> <base> <group> [MAX <n> | NOMAX] [PAUSE | RESUME]
--                                                                   (module/emq_grouplimit.c)
--
-- MAX <n> caps the group (never more than <n> of its jobs active at once), NOMAX removes the
-- cap; PAUSE holds its waiting jobs back, RESUME lets them be claimed again.  The group enters
-- the ring when it may be claimed now, and leaves it when capped at or below its active count
-- or paused.  No option: a read.  Reply: [max (nil: none), active, waiting, paused].
-- Not deny-oom (allow-oom), as EMQ.LIMIT and EMQ.PAUSE.
local function parse(argv, argc)
    local a = { max_set = false, nomax = false, pause = false, resume = false }
    if argv[3] ~= '*' then a.group = emq.parse_group(argv[3]) end
    local i = 4
    while i < argc do
        local opt = argv[i]
        if emq.option_is(opt, 'NOMAX') and not a.nomax and not a.max_set then
            a.nomax = true
            i = i + 1
        elseif emq.option_is(opt, 'PAUSE') and not a.pause and not a.resume and a.group then
            a.pause = true
            i = i + 1
        elseif emq.option_is(opt, 'RESUME') and not a.pause and not a.resume and a.group then
            a.resume = true
            i = i + 1
        else
            if i + 1 >= argc then emq.refuse(emq.E.SYNTAX) end
            if not emq.option_is(opt, 'MAX') or a.max_set or a.nomax then emq.refuse(emq.E.SYNTAX) end
            a.max_set = true
            a.max = emq.parse_group_max(argv[i + 1])
            i = i + 2
        end
    end
    return a
end

-- ring_leave (emq_grouplimit.c): the ring without the group (DEL, then RPUSH of what stays), or
-- no ring at all when no other group is left in it (<base>meta's `ring` goes too).
local function ring_leave_all(base, gone)
    local ring = base .. 'groups'
    local stay, groups = {}, 0
    if emq.type(ring) == 'list' then
        for _, m in ipairs(redis.call('LRANGE', ring, 0, -1)) do
            if not gone[m] then
                stay[#stay + 1] = m
                if m ~= '' then groups = groups + 1 end
            end
        end
        redis.call('DEL', ring)
    end
    if groups > 0 then
        for i = 1, #stay, 1000 do redis.call('RPUSH', ring, unpack(stay, i, math.min(i + 999, #stay))) end
    else
        local meta = base .. 'meta'
        if emq.type(meta) == 'hash' then redis.call('HDEL', meta, 'ring') end
    end
end

local function ring_leave(base, group)
    ring_leave_all(base, { [group] = true })
end

-- default_limit (emq_grouplimit.c): `*`, the queue's default cap, <base>meta's `group_max`; a
-- change re-evaluates every group's ring membership (at most GROUP_WALK_MAX groups).
local GROUP_WALK_MAX = 10000
local function default_limit(base, a)
    local writes = a.max_set or a.nomax
    local meta = base .. 'meta'
    if not emq.type_ok(emq.open_derived(meta, writes and emq.READ_WRITE or emq.READ), 'hash') then
        emq.refuse(emq.E.WRONGTYPE)
    end
    emq.group_index_check(base)
    local cap = emq.group_default_cap(base)
    local index = base .. 'groupset'
    local names = emq.type(index) == 'zset' and redis.call('ZRANGE', index, 0, -1) or {}
    local next_cap = a.max_set and a.max or (a.nomax and emq.NO_CAP or cap)
    if next_cap ~= cap then
        if #names > GROUP_WALK_MAX then emq.refuse(emq.E.GROUP_WALK) end
        for _, g in ipairs(names) do
            emq.group_settle_check(base, g)
            local name = base .. 'group:' .. g
            local htype = emq.open_derived(name, emq.READ_WRITE)
            if not emq.type_ok(htype, 'hash') then emq.refuse(emq.E.WRONGTYPE) end
            emq.group_caps_read(name, htype, base)
        end
        if a.max_set then redis.call('HSET', meta, 'group_max', emq.int(next_cap)) else redis.call('HDEL', meta, 'group_max') end
        local gone, leaving = {}, false
        for _, g in ipairs(names) do
            local name = base .. 'group:' .. g
            local htype = emq.type(name)
            local active, in_force = emq.group_caps_read(name, htype, base)
            local in_ring = emq.hexists(name, htype, 'ring')
            if in_ring and not emq.group_claimable(true, emq.hexists(name, htype, 'paused'), active, in_force) then
                redis.call('HDEL', name, 'ring')
                gone[g], leaving = true, true
            end
            if not in_ring then emq.group_settle(base, g) end
        end
        if leaving then ring_leave_all(base, gone) end
        cap = next_cap
    end
    return { cap ~= emq.NO_CAP and cap or false, #names }
end

return emq.verb({ 'HSET', 'HDEL', 'DEL', 'RPUSH', 'LRANGE', 'ZADD', 'ZREM' }, function()
    -- parse
    local argv, argc = emq.args()
    if argc < 4 then emq.wrong_arity('emq.grouplimit') end
    local a = parse(argv, argc)
    local base = argv[2]
    emq.check_queue(argv, 1, { 'pending' }, base, emq.E.PENDING_KEY)
    if a.group == nil then return default_limit(base, a) end
    local writes = a.max_set or a.nomax or a.pause or a.resume

    -- open, type-check and read: the group's hash, then its lane, the ring and <base>meta
    local name, lane = base .. 'group:' .. a.group, base .. 'g:' .. a.group
    local htype = emq.open_derived(name, writes and emq.READ_WRITE or emq.READ)
    if not emq.type_ok(htype, 'hash') then emq.refuse(emq.E.WRONGTYPE) end
    emq.group_active_read(name, htype)
    local active, cap = emq.group_caps_read(name, htype, base) -- the cap in force
    local own, fallback = emq.NO_CAP, emq.NO_CAP -- its own `max`; the queue's default
    if emq.hget(name, htype, 'max') == nil then fallback = cap else own, fallback = cap, emq.group_default_cap(base) end
    local paused, in_ring = emq.hexists(name, htype, 'paused'), emq.hexists(name, htype, 'ring')
    local ltype = emq.open_derived(lane, emq.READ)
    if not emq.type_ok(ltype, 'zset') then emq.refuse(emq.E.WRONGTYPE) end
    local waiting = ltype == 'zset' and redis.call('ZCARD', lane) or 0
    if writes then emq.group_settle_check(base, a.group) end

    -- decide and apply: the settings, then the ring
    local existed = htype == 'hash'
    local next_cap = a.max_set and a.max or (a.nomax and emq.NO_CAP or own)
    local next_paused = a.pause or (not a.resume and paused)
    if next_cap ~= own then
        if a.max_set then redis.call('HSET', name, 'max', emq.int(next_cap)) else redis.call('HDEL', name, 'max') end
    end
    if next_paused ~= paused then
        if next_paused then redis.call('HSET', name, 'paused', '1') else redis.call('HDEL', name, 'paused') end
    end
    own, paused = next_cap, next_paused
    cap = own ~= emq.NO_CAP and own or fallback
    local leaves = in_ring and not emq.group_claimable(true, paused, active, cap)
    if leaves then redis.call('HDEL', name, 'ring') end
    if writes then emq.group_index_sync(base, a.group, existed) end
    if leaves then
        ring_leave(base, a.group)
    elseif not in_ring and emq.group_claimable(waiting > 0, paused, active, cap) then
        emq.group_settle(base, a.group)
    end
    return { own ~= emq.NO_CAP and own or false, active, waiting, paused and 1 or 0 }
end)
