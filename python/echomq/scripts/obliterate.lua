#!lua flags=allow-oom
-- EMQ.OBLITERATE <active> <pending> <dead> <base> <limit> [FORCE]     (module/emq_admin.c)
--
-- One bounded step of deleting a queue: up to <limit> entries of <pending>, then members of
-- <base>priority, <base>delayed, <dead>, then <active> (with FORCE), each with its row (a
-- tombstone of <pending> has none: it only leaves, counted off `stale`).  While members remain
-- after the step the queue is paused (meta `paused`); the step that leaves them all empty also
-- deletes <base>meta and <base>metrics:failed.  Reply [removed, remaining]: the jobs removed
-- (tombstones not counted), the entries and members left (tombstones counted).  -EMQBUSY when
-- <active> is not empty and FORCE is not given: nothing written.  A job deleted before it ended
-- is announced on <base>done:<id>.  Not deny-oom (allow-oom): it frees memory.
return emq.verb({ 'ZREM', 'DEL', 'HSET', 'HDEL', 'LPOP', 'RPUSH', 'ZADD' }, function()
    -- parse
    local argv, argc, max_limit = emq.args()
    if argc ~= 6 and argc ~= 7 then emq.wrong_arity('emq.obliterate') end
    local force = false
    if argc == 7 then
        if not emq.option_is(argv[6], 'FORCE') then emq.refuse(emq.E.SYNTAX) end
        force = true
    end
    local active, pending, dead, base = argv[1], argv[2], argv[3], argv[4]
    emq.check_queue(argv, 1, { 'active', 'pending', 'dead' }, base, emq.E.THREE_SETS)
    local limit = emq.parse_limit(argv[5], emq.max_limit(max_limit))

    -- open and type-check
    if not emq.type_ok(emq.type(active), 'zset') or not emq.type_ok(emq.type(pending), 'list')
        or not emq.type_ok(emq.type(dead), 'zset') then
        emq.refuse(emq.E.WRONGTYPE)
    end
    if not force and redis.call('EXISTS', active) == 1 then emq.refuse(emq.E.BUSY) end
    local lanes = emq.lanes(base, pending)
    lanes:open(true, true, false)
    -- the group lanes are found from the ring: a group whose lane holds a job is in it
    local mtype = emq.open_derived(base .. 'meta', emq.READ)
    if emq.hexists(base .. 'meta', mtype, 'ring') then lanes:open_ring() end
    for i = 0, lanes.ring_len - 1 do
        local m = lanes:ring_at(i)
        if m ~= nil and m ~= '' then lanes:group(m) end
    end
    -- then the index's (emq_group.h): a group held out of the ring by its cap or pause has its lane
    local index = base .. 'groupset'
    if emq.open_derived(index, emq.LANE) == 'zset' then
        for _, m in ipairs(redis.call('ZRANGE', index, 0, -1)) do lanes:group(m) end
    elseif not emq.type_ok(emq.type(index), 'zset') then
        emq.refuse(emq.E.WRONGTYPE)
    end

    -- read: the entries and members this step takes, <pending> first, the held last; every row
    -- it reads or deletes is checked first
    local members, entries, tombstones, deleting = {}, 0, 0, {}
    local entry = lanes:entries()
    while #members < limit do
        local id = entry(entries)
        if id == nil then break end
        entries = entries + 1
        local row = base .. 'job:' .. id
        local rtype = emq.open_derived(row, emq.READ_DELETE)
        if not emq.type_ok(rtype, 'hash') then emq.refuse(emq.E.WRONGTYPE) end
        local live = rtype == 'hash' and emq.hget(row, rtype, 'state') == 'pending'
            and not emq.hexists(row, rtype, 'priority') and not lanes:is_delayed(id) and not deleting[id]
        if live then deleting[id] = true else tombstones = tombstones + 1 end
        members[#members + 1] = { id = id, row = row, deletes = live, ended = false }
    end
    for _, set in ipairs({ lanes.priority, lanes.delayed, dead, active }) do
        for _, id in ipairs(emq.zset_head(set, '+inf', limit - #members)) do
            members[#members + 1] = { id = id, set = set, row = base .. 'job:' .. id, deletes = true, ended = set == dead }
        end
    end
    local grouped = 0
    for _, g in ipairs(lanes.gl) do
        grouped = grouped + g.card
        for _, id in ipairs(emq.zset_head(g.lane, '+inf', limit - #members)) do
            members[#members + 1] = { id = id, set = g.lane, row = base .. 'job:' .. id, deletes = true, ended = false }
        end
    end
    local remaining = redis.call('LLEN', pending) + redis.call('ZCARD', lanes.priority)
        + redis.call('ZCARD', lanes.delayed) + redis.call('ZCARD', dead) + redis.call('ZCARD', active) + grouped
        - #members

    -- decide: every key this step deletes or writes is checked first
    for _, m in ipairs(members) do
        if m.set then emq.open_derived(m.row, emq.DELETE) end
    end
    for _, m in ipairs(members) do
        if m.set == active then emq.left_active_prepare(base, m.id) end
        if m.deletes then emq.ended_prepare(base, m.id, 'deleted', m.ended) end
    end
    local metrics, meta, registry = base .. 'metrics:failed', base .. 'meta', base .. 'queue'
    if remaining == 0 then
        emq.open_derived(metrics, emq.DELETE)
        emq.open_derived(registry, emq.DELETE) -- the queue registry's marker (module/emq_registry.h)
        -- the step that empties the sets deletes <base>meta (whatever it holds: a meta of the
        -- wrong type cannot be paused, but it can be deleted)
        emq.open_derived(meta, emq.DELETE)
    else
        -- the others pause the queue in it, and count off the tombstones
        lanes:open(false, false, true)
        local d = emq.int(tombstones)
        local stale = emq.dec_cmp(lanes.stale, d) > 0 and emq.dec_add(lanes.stale, '-' .. d) or '0'
        if stale ~= lanes.stale then
            lanes.stale = stale
            lanes.stale_changed = true
        end
    end

    -- a group whose active job this step takes off is settled after the lanes' writes (a step
    -- that is not the last), or not at all (the last deletes the ring) (emq_admin.c)
    emq.defer_settle()
    -- apply: the entries of <pending> in one LPOP, then member by member
    if entries > 0 then redis.call('LPOP', pending, entries) end
    for _, m in ipairs(members) do
        if m.set then redis.call('ZREM', m.set, m.id) end
        if m.set == active then emq.left_active_apply(base, m.id) end
        if m.deletes then
            redis.call('DEL', m.row)
            emq.ended_apply(base, m.id, 'deleted', m.ended)
        end
    end
    if remaining == 0 then
        redis.call('DEL', meta)
        redis.call('DEL', metrics)
        redis.call('DEL', registry)
        -- the ring, and its groups' flags
        if lanes.ring_len > 0 then redis.call('DEL', lanes.ring) end
        for _, g in ipairs(lanes.gl) do
            if emq.type(g.hash) == 'hash' then
                redis.call('HDEL', g.hash, 'ring')
                emq.group_index_sync(base, g.group, true)
            end
        end
    else
        if not emq.hexists(meta, lanes.types.meta, 'paused') then redis.call('HSET', meta, 'paused', '1') end
        lanes:apply()
        emq.settle_deferred(base)
    end
    return { #members - tombstones, remaining } -- the jobs removed (a tombstone is none), the entries left
end)
