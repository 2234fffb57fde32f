#!lua flags=allow-oom
-- EMQ.COMPLETE <active> <job> <id> <token>                             (module/emq_finish.c)
--
-- :1 the job leaves <active>; its row gets state=done and finished_at, and expires after the
-- queue's done retention.  :-1 gone; -EMQSTALE wrong token or no longer active (nothing
-- written).  A retry of a COMPLETE whose reply was lost (closed_by=complete) answers :1 and
-- writes nothing.  Not deny-oom (allow-oom): finishing a job must work under memory pressure.
return emq.verb({ 'ZREM', 'HSET', 'DEL', 'PEXPIREAT' }, function()
    -- parse
    local argv, argc = emq.args()
    if argc ~= 5 then emq.wrong_arity('emq.complete') end
    local active, row, id, token = argv[1], argv[2], argv[3], argv[4]
    if active == row then emq.refuse(emq.E.SAME_KEY) end
    if not emq.job_key_matches(active, row, id) then emq.refuse(emq.E.JOB_KEY) end
    local now = emq.now_ms()

    -- open and type-check
    local rtype = emq.type(row)
    if not emq.type_ok(emq.type(active), 'zset') or not emq.type_ok(rtype, 'hash') then
        emq.refuse(emq.E.WRONGTYPE)
    end

    -- read and decide
    local holder, retry = emq.check_holder_or_retry(active, row, rtype, id, token, 'complete')
    if holder == emq.HOLDER_GONE then return -1 end
    if holder ~= emq.HOLDER_OK then
        if retry then return 1 end
        emq.refuse(emq.holder_error('complete', holder))
    end
    local meta = emq.read_meta(active:sub(1, #active - #'active'))

    -- apply
    redis.call('ZREM', active, id)
    redis.call('HSET', row, 'state', 'done', 'finished_at', emq.int(now), 'closed_by', 'complete')
    emq.retain(row, now, meta.done_ttl)
    return 1
end)
