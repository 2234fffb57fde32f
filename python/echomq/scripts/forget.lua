#!lua flags=allow-oom
-- EMQ.FORGET <pending> <base> <id> [<id> ...]                          (module/emq_admin.c)
--
-- DELetes each row <base>job:<id> whose state is done or cancelled (a finished job in no
-- set); other rows and absent ones are left alone.  Reply :<n>, the rows deleted.  At most
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
        forget[#rows] = state == 'done' or state == 'cancelled'
    end

    -- the rows deleted are of jobs that ended: the `ended` hook's deletion steps run
    for i = 1, #rows do
        if forget[i] then emq.ended_prepare(base, argv[2 + i], 'deleted', true) end
    end

    -- apply
    local deleted = 0
    for i, row in ipairs(rows) do
        if forget[i] then
            deleted = deleted + redis.call('DEL', row)
            emq.ended_apply(base, argv[2 + i], 'deleted', true)
        end
    end
    return deleted
end)
