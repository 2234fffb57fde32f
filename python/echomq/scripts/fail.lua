#!lua
-- EMQ.FAIL <active> <pending> <dead> <base> <id> <token> <max-attempts> <error>
--          [DELAY <ms>] [TRACE <text>] [DEAD]                          (module/emq_finish.c)
--
-- The holder's handler failed.  Below <max-attempts> tries (claims since the job was
-- enqueued or last retried) the job goes back to the tail of its lane (or, with DELAY ms, the
-- worker's backoff, to <base>delayed until then); at it, or at once with DEAD, the job is
-- dead-lettered (into <dead>, scored with the time it died) and counted in
-- <base>metrics:failed.  The row keeps the error text in last_error, and the traceback in
-- `traceback` with TRACE (a FAIL without TRACE deletes an earlier one).  A job with a cancel
-- request ends as state=cancelled instead.  A job that ends is announced on <base>done:<id>.
-- Reply: +pending, +dead or +cancelled; :-1 gone; -EMQSTALE as COMPLETE; a retry answers where
-- the first call sent the job.
local MAX_TRACE_BYTES = 65536

-- [DELAY <ms>] [TRACE <text>] [DEAD] from argv[9] on, each once, in any order.
local function fail_options(argv, argc, now)
    local due, trace, dead, seen_delay = now, nil, false, false
    local i = 9
    while i < argc do
        local opt = argv[i]
        if emq.option_is(opt, 'DEAD') and not dead then
            dead = true
            i = i + 1
        else
            if i + 1 >= argc then emq.refuse(emq.E.SYNTAX) end
            local val = argv[i + 1]
            if emq.option_is(opt, 'DELAY') and not seen_delay then
                seen_delay = true
                due = emq.due_after_delay(now, val)
            elseif emq.option_is(opt, 'TRACE') and not trace then
                if #val > MAX_TRACE_BYTES then emq.refuse(emq.E.TRACE_TOO_LARGE) end
                trace = val
            else
                emq.refuse(emq.E.SYNTAX)
            end
            i = i + 2
        end
    end
    return due, trace, dead
end

return emq.verb({ 'ZREM', 'HSET', 'HDEL', 'ZADD', 'RPUSH', 'HINCRBY', 'DEL', 'PEXPIREAT' }, function()
    -- parse
    local argv, argc = emq.args()
    if argc < 9 then emq.wrong_arity('emq.fail') end
    local active, pending, dead, base = argv[1], argv[2], argv[3], argv[4]
    emq.check_queue(argv, 1, { 'active', 'pending', 'dead' }, base, emq.E.THREE_SETS)
    emq.parse_count(argv[7], emq.E.MAX_ATTEMPTS)
    local id, token, error_text = argv[5], argv[6], argv[8]
    local now = emq.now_ms()
    local due, trace, dead_now = fail_options(argv, argc, now)

    -- open and type-check: the derived row's ACL before it is read
    if not emq.type_ok(emq.type(active), 'zset') or not emq.type_ok(emq.type(pending), 'list')
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
    elseif dead_now or emq.dec_cmp(tries, emq.canonical(argv[7])) >= 0 then
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
    local lanes = emq.lanes(base, pending)
    if route == emq.TO_PENDING then
        -- a grouped job retried at once goes back to its group's head (emq_finish.c)
        if due == now and emq.hget(row, rtype, 'group') then
            lanes:place_row(id, row, rtype, true)
        else
            lanes:enter_row(id, row, rtype, due, now)
        end
    end
    emq.left_active_prepare(base, id)
    if route ~= emq.TO_PENDING then emq.ended_prepare(base, id, route, false) end

    -- apply
    local at = emq.int(now)
    redis.call('ZREM', active, id)
    emq.left_active_apply(base, id)
    if trace == nil then redis.call('HDEL', row, 'traceback') end
    local fields = { 'state', route, 'last_error', error_text }
    if trace then
        fields[#fields + 1] = 'traceback'
        fields[#fields + 1] = trace
    end
    if route ~= emq.TO_PENDING then
        fields[#fields + 1] = 'finished_at'
        fields[#fields + 1] = at
    end
    fields[#fields + 1] = 'closed_by'
    fields[#fields + 1] = 'fail:' .. route
    redis.call('HSET', row, unpack(fields))
    if route == emq.TO_PENDING then
        lanes:apply()
    elseif route == emq.TO_DEAD then
        redis.call('ZADD', dead, at, id)
        redis.call('HINCRBY', metrics, 'count', 1)
        emq.ended_apply(base, id, route, false)
    else
        emq.ended_apply(base, id, route, false)
        emq.retain(row, now, meta.cancelled_ttl)
    end
    return redis.status_reply(route)
end)
