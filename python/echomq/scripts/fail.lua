#!lua
-- EMQ.FAIL <active> <pending> <dead> <base> <id> <token> <max-attempts> <error> [DELAY <ms>]
--                                                                     (module/emq_finish.c)
--
-- The holder's handler failed.  Below <max-attempts> tries (claims since the job was
-- enqueued or last retried) the job goes back to <pending> at server-now (+ DELAY ms: the
-- worker's backoff; it is claimable again only then); at it, the job is
-- dead-lettered (into <dead>, scored with the time it died) and counted in
-- <base>metrics:failed.  The row keeps the error text in last_error either way.  A job with
-- a cancel request ends as state=cancelled instead.  Reply: +pending, +dead or +cancelled;
-- :-1 gone; -EMQSTALE as COMPLETE; a retry answers where the first call sent the job.
return emq.verb({ 'ZREM', 'HSET', 'ZADD', 'HINCRBY', 'DEL', 'PEXPIREAT' }, function()
    -- parse
    local argv, argc = emq.args()
    if argc < 9 then emq.wrong_arity('emq.fail') end
    local active, pending, dead, base = argv[1], argv[2], argv[3], argv[4]
    emq.check_queue(argv, 1, { 'active', 'pending', 'dead' }, base, emq.E.THREE_SETS)
    emq.parse_count(argv[7], emq.E.MAX_ATTEMPTS)
    local id, token, error_text = argv[5], argv[6], argv[8]
    local now = emq.now_ms()
    local due = now
    if argc > 9 then -- [DELAY <ms>]: the worker's backoff
        if argc ~= 11 or not emq.option_is(argv[9], 'DELAY') then emq.refuse(emq.E.SYNTAX) end
        due = emq.due_after_delay(now, argv[10])
    end

    -- open and type-check: the derived row's ACL before it is read
    if not emq.type_ok(emq.type(active), 'zset') or not emq.type_ok(emq.type(pending), 'zset')
        or not emq.type_ok(emq.type(dead), 'zset') then
        emq.refuse(emq.E.WRONGTYPE)
    end
    local row = base .. 'job:' .. id
    local rtype = emq.open_derived(row, emq.READ_WRITE)
    if not emq.type_ok(rtype, 'hash') then emq.refuse(emq.E.WRONGTYPE) end

    -- read and decide
    local holder, retry, route = emq.check_holder_or_retry(active, row, rtype, id, token, 'fail')
    if holder == emq.HOLDER_GONE then return -1 end
    if retry then return redis.status_reply(route) end -- where the first call sent the job
    local refusal = emq.holder_error('fail', holder)
    if refusal then emq.refuse(refusal) end
    -- the budget is `tries`; a row written before tries existed counts its attempts
    local tries
    if emq.hexists(row, rtype, 'tries') then
        tries = emq.incr(emq.hget(row, rtype, 'tries'), '0', emq.E.TRIES_NOT_INTEGER)
    else
        tries = emq.incr(emq.hget(row, rtype, 'attempts'), '0', emq.E.ATTEMPTS_NOT_INTEGER)
    end
    if emq.hexists(row, rtype, 'cancel_requested') then
        route = emq.TO_CANCELLED
    elseif emq.dec_cmp(tries, emq.canonical(argv[7])) >= 0 then
        route = emq.TO_DEAD
    else
        route = emq.TO_PENDING
    end
    local meta = emq.read_meta(base)
    local metrics = base .. 'metrics:failed'
    if route == emq.TO_DEAD then
        local mtype = emq.open_derived(metrics, emq.READ_WRITE)
        if not emq.type_ok(mtype, 'hash') then emq.refuse(emq.E.WRONGTYPE) end
        emq.incr(emq.hget(metrics, mtype, 'count'), '1', emq.E.FAILED_NOT_INTEGER)
    end

    -- apply
    local at = emq.int(now)
    redis.call('ZREM', active, id)
    if route == emq.TO_PENDING then
        redis.call('HSET', row, 'state', 'pending', 'last_error', error_text, 'closed_by', 'fail:pending')
        redis.call('ZADD', pending, emq.int(due), id)
    elseif route == emq.TO_DEAD then
        redis.call('HSET', row, 'state', 'dead', 'last_error', error_text, 'finished_at', at,
            'closed_by', 'fail:dead')
        redis.call('ZADD', dead, at, id)
        redis.call('HINCRBY', metrics, 'count', 1)
    else
        redis.call('HSET', row, 'state', 'cancelled', 'last_error', error_text, 'finished_at', at,
            'closed_by', 'fail:cancelled')
        emq.retain(row, now, meta.cancelled_ttl)
    end
    return redis.status_reply(route)
end)
