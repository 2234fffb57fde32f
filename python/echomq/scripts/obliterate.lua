#!lua flags=allow-oom
-- EMQ.OBLITERATE <active> <pending> <dead> <base> <limit> [FORCE]     (module/emq_admin.c)
--
-- One bounded step of deleting a queue: up to <limit> members of <pending>, then <dead>,
-- then <active> (with FORCE), each with its row.  While members remain after the step the
-- queue is paused (meta `paused`); the step that leaves the three sets empty also deletes
-- <base>meta and <base>metrics:failed.  Reply [removed, remaining].  -EMQBUSY when <active>
-- is not empty and FORCE is not given: nothing written.  Not deny-oom (allow-oom): it frees
-- memory.
return emq.verb({ 'ZREM', 'DEL', 'HSET' }, function()
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
    for _, set in ipairs({ active, pending, dead }) do
        if not emq.type_ok(emq.type(set), 'zset') then emq.refuse(emq.E.WRONGTYPE) end
    end
    if not force and redis.call('EXISTS', active) == 1 then emq.refuse(emq.E.BUSY) end

    -- read: the members this step takes, pending first, the held last
    local members = {}
    for _, set in ipairs({ pending, dead, active }) do
        for _, id in ipairs(emq.zset_head(set, '+inf', math.min(limit, 2147483647) - #members)) do
            members[#members + 1] = { id = id, set = set, row = base .. 'job:' .. id }
        end
    end
    local remaining = redis.call('ZCARD', active) + redis.call('ZCARD', pending) + redis.call('ZCARD', dead)
        - #members

    -- decide: every key this step deletes or writes is checked first
    for _, m in ipairs(members) do
        emq.open_derived(m.row, emq.DELETE)
    end
    local metrics, meta = base .. 'metrics:failed', base .. 'meta'
    if remaining == 0 then emq.open_derived(metrics, emq.DELETE) end
    -- the step that empties the sets deletes <base>meta (whatever it holds: a meta of the wrong
    -- type cannot be paused, but it can be deleted); the others pause the queue in it
    local mtype = emq.open_derived(meta, remaining == 0 and emq.DELETE or emq.READ_WRITE)
    if not emq.type_ok(mtype, 'hash') and remaining ~= 0 then emq.refuse(emq.E.WRONGTYPE) end

    -- apply
    for _, m in ipairs(members) do
        redis.call('ZREM', m.set, m.id)
        redis.call('DEL', m.row)
    end
    if remaining == 0 then
        redis.call('DEL', meta)
        redis.call('DEL', metrics)
    elseif not emq.hexists(meta, mtype, 'paused') then
        redis.call('HSET', meta, 'paused', '1')
    end
    return { #members, remaining }
end)
