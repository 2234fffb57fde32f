#!lua flags=allow-oom
-- EMQ.FORGET <pending> <base> <id> [<id> ...]                          (module/emq_admin.c)
--
-- DELetes each row <base>job:<id> whose state is done or cancelled (a finished job in no
-- set), or waiting (for its dependencies: it leaves their waiter sets, and what waits on it
-- resolves as `deleted`, _deps.lua); other rows and absent ones are left alone.  Reply :<n>, the rows deleted.  At most
-- emq.max-limit ids (the client's ScriptLimits.max_limit, <setting>).  Not deny-oom
-- (allow-oom): it frees memory.
return emq.verb({ 'DEL' }, function()
    -- parse
    local argv, argc, max_limit = emq.args()
    if argc < 4 then emq.wrong_arity('emq.forget') end
    local base = argv[2]
    emq.check_queue(argv, 1, { 'pending' }, base, emq.E.PENDING_KEY)
    if argc - 3 > emq.max_limit(max_limit) then emq.refuse(emq.E.FORGET_TOO_MANY) end

    -- open, type-check, read and decide, one row at a time (an id may be named twice)
    local rows, forget = {}, {}
    for i = 3, argc - 1 do
        local row = base .. 'job:' .. argv[i]
        local rtype = emq.open_derived(row, emq.READ_DELETE)
        if not emq.type_ok(rtype, 'hash') then emq.refuse(emq.E.WRONGTYPE) end
        local state = emq.hget(row, rtype, 'state')
        rows[#rows + 1] = row
        -- a waiting job (emq_deps.c) is in no set either: deleted, and what waits on it resolves
        forget[#rows] = (state == 'done' or state == 'cancelled') and 1 or state == 'waiting' and 2 or false
    end

    -- the rows deleted are of jobs that ended (the `ended` hook's deletion steps run) or waited
    -- (all of its steps: it vanishes before it ended)
    for i = 1, #rows do
        if forget[i] then emq.ended_prepare(base, argv[2 + i], 'deleted', forget[i] == 1) end
    end

    -- apply
    local deleted = 0
    for i, row in ipairs(rows) do
        if forget[i] then
            local gone = redis.call('DEL', row)
            deleted = deleted + gone
            -- an id named twice: the second finds no row, and its end ran once
            if gone == 1 or forget[i] == 1 then emq.ended_apply(base, argv[2 + i], 'deleted', forget[i] == 1) end
        end
    end
    return deleted
end)
