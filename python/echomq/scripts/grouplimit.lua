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
    local a = { max_set = false, nomax = false, pause = false, resume = false, group = emq.parse_group(argv[3]) }
    local i = 4
    while i < argc do
        local opt = argv[i]
        if emq.option_is(opt, 'NOMAX') and not a.nomax and not a.max_set then
            a.nomax = true
            i = i + 1
        elseif emq.option_is(opt, 'PAUSE') and not a.pause and not a.resume then
            a.pause = true
            i = i + 1
        elseif emq.option_is(opt, 'RESUME') and not a.pause and not a.resume then
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
local function ring_leave(base, group)
    local ring = base .. 'groups'
    local stay, groups = {}, 0
    if emq.type(ring) == 'list' then
        for _, m in ipairs(redis.call('LRANGE', ring, 0, -1)) do
            if m ~= group then
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

return emq.verb({ 'HSET', 'HDEL', 'DEL', 'RPUSH', 'LRANGE', 'ZADD', 'ZREM' }, function()
    -- parse
    local argv, argc = emq.args()
    if argc < 4 then emq.wrong_arity('emq.grouplimit') end
    local a = parse(argv, argc)
    local base = argv[2]
    emq.check_queue(argv, 1, { 'pending' }, base, emq.E.PENDING_KEY)
    local writes = a.max_set or a.nomax or a.pause or a.resume

    -- open, type-check and read: the group's hash, then its lane, the ring and <base>meta
    local name, lane = base .. 'group:' .. a.group, base .. 'g:' .. a.group
    local htype = emq.open_derived(name, writes and emq.READ_WRITE or emq.READ)
    if not emq.type_ok(htype, 'hash') then emq.refuse(emq.E.WRONGTYPE) end
    emq.group_active_read(name, htype)
    local active, cap = emq.group_caps_read(name, htype)
    local paused, in_ring = emq.hexists(name, htype, 'paused'), emq.hexists(name, htype, 'ring')
    local ltype = emq.open_derived(lane, emq.READ)
    if not emq.type_ok(ltype, 'zset') then emq.refuse(emq.E.WRONGTYPE) end
    local waiting = ltype == 'zset' and redis.call('ZCARD', lane) or 0
    if writes then emq.group_settle_check(base, a.group) end

    -- decide and apply: the settings, then the ring
    local existed = htype == 'hash'
    local next_cap = a.max_set and a.max or (a.nomax and emq.NO_CAP or cap)
    local next_paused = a.pause or (not a.resume and paused)
    if next_cap ~= cap then
        if a.max_set then redis.call('HSET', name, 'max', emq.int(next_cap)) else redis.call('HDEL', name, 'max') end
    end
    if next_paused ~= paused then
        if next_paused then redis.call('HSET', name, 'paused', '1') else redis.call('HDEL', name, 'paused') end
    end
    cap, paused = next_cap, next_paused
    local leaves = in_ring and not emq.group_claimable(true, paused, active, cap)
    if leaves then redis.call('HDEL', name, 'ring') end
    if writes then emq.group_index_sync(base, a.group, existed) end
    if leaves then
        ring_leave(base, a.group)
    elseif not in_ring and emq.group_claimable(waiting > 0, paused, active, cap) then
        emq.group_settle(base, a.group)
    end
    return { cap ~= emq.NO_CAP and cap or false, active, waiting, paused and 1 or 0 }
end)
