#!lua flags=allow-oom
-- include: _flow.lua
-- EMQ.RELEASE <active> <pending> <base> <id> <token> [BACKOFF <ms>]    (module/emq_finish.c)
--
-- The holder gives the job back without using an attempt: it leaves <active>, its row's
-- `tries` goes back down by one (never below 0), no stall is counted, and it waits at the
-- head of its lane (<pending>'s head, or below its level's first job in <base>priority).  A job whose
-- cancel was requested ends cancelled (announced on <base>done:<id>).  Reply: +pending or
-- +cancelled; :-1 gone; -EMQSTALE as COMPLETE; a retry answers as the first call did.  Not
-- deny-oom (allow-oom): a shutdown must give jobs back under memory pressure.  BACKOFF (a
-- handler's 429, _flow.lua) also stops every claim of the queue until now + <ms>.
return emq.verb({ 'ZREM', 'HSET', 'LPUSH', 'RPUSH', 'ZADD', 'DEL', 'PEXPIREAT' }, function()
    -- parse
    local argv, argc = emq.args()
    if argc < 6 then emq.wrong_arity('emq.release') end
    local backoff = 0
    if argc ~= 6 then
        if argc ~= 8 or not emq.option_is(argv[6], 'BACKOFF') then emq.refuse(emq.E.SYNTAX) end
        local v = argv[7]
        local n = emq.parse_ll(v)
        if n == nil or n < 0 or emq.dec_cmp(v, emq.int(emq.RATE_PER_MAX)) > 0 then emq.refuse(emq.E.BACKOFF) end
        backoff = n
    end
    local active, pending, base = argv[1], argv[2], argv[3]
    emq.check_queue(argv, 1, { 'active', 'pending' }, base, emq.E.PENDING_ACTIVE_ORDER)
    local id, token = argv[4], argv[5]
    local now = emq.now_ms()

    -- open and type-check: the derived row's ACL before it is read
    if not emq.type_ok(emq.type(active), 'zset') or not emq.type_ok(emq.type(pending), 'list') then
        emq.refuse(emq.E.WRONGTYPE)
    end
    local row = base .. 'job:' .. id
    local rtype = emq.open_derived(row, emq.READ_WRITE)
    if not emq.type_ok(rtype, 'hash') then emq.refuse(emq.E.WRONGTYPE) end

    -- read and decide
    local holder, retry, first_route = emq.check_holder_or_retry(active, row, rtype, id, token, 'release')
    local cancelled = emq.hexists(row, rtype, 'cancel_requested')
    if holder == emq.HOLDER_GONE then return -1 end
    if retry then -- the first call's answer
        return redis.status_reply(first_route == emq.TO_CANCELLED and 'cancelled' or 'pending')
    end
    local refusal = emq.holder_error('release', holder)
    if refusal then emq.refuse(refusal) end
    local tries = emq.incr(emq.hget(row, rtype, 'tries'), '0', emq.E.TRIES_NOT_INTEGER)
    local meta
    local lanes = emq.lanes(base, pending)
    if cancelled then
        meta = emq.read_meta(base)
    else
        lanes:place_row(id, row, rtype, true)
    end
    emq.left_active_prepare(base, id)
    if cancelled then emq.ended_prepare(base, id, 'cancelled', false) end
    local flow = backoff > 0 and emq.flow_backoff_prepare(base, now, backoff) or nil

    -- apply
    redis.call('ZREM', active, id)
    emq.left_active_apply(base, id)
    if cancelled then
        redis.call('HSET', row, 'state', 'cancelled', 'finished_at', emq.int(now), 'closed_by', 'release:cancelled')
        emq.ended_apply(base, id, 'cancelled', false)
        emq.retain(row, now, meta.cancelled_ttl)
        emq.flow_backoff_apply(flow)
        return redis.status_reply('cancelled')
    end
    local back = emq.dec_cmp(tries, '0') > 0 and emq.dec_add(tries, '-1') or '0'
    redis.call('HSET', row, 'tries', back, 'state', 'pending', 'closed_by', 'release:pending')
    lanes:apply()
    emq.flow_backoff_apply(flow)
    return redis.status_reply('pending')
end)
