#!lua
-- EMQ.CANCEL <pending> <base> <id> <reason>                            (module/emq_cancel.c)
--
-- +cancelled  the job was waiting (state pending): it left its lane (its <pending> entry
--             stays, a tombstone claims drop), state=cancelled, announced on <base>done:<id>
-- +requested  the job is held (or otherwise not pending): the request is on the row for the
--             holder's next EMQ.CHECKPOINT, and <id> is published on <base>cancel
-- +finished   the job is done, dead or cancelled already: nothing written
-- :-1         no such job
-- Token-free and idempotent: asking again keeps the first reason.
return emq.verb({ 'ZREM', 'HSET', 'DEL', 'PEXPIREAT' }, function()
    -- parse
    local argv, argc = emq.args()
    if argc ~= 5 then emq.wrong_arity('emq.cancel') end
    local pending, base = argv[1], argv[2]
    emq.check_queue(argv, 1, { 'pending' }, base, emq.E.PENDING_KEY)
    local id, reason = argv[3], argv[4]
    local now = emq.now_ms()

    -- open and type-check: the derived row's ACL before it is read
    if not emq.type_ok(emq.type(pending), 'list') then emq.refuse(emq.E.WRONGTYPE) end
    local row = base .. 'job:' .. id
    local rtype = emq.open_derived(row, emq.READ_WRITE)
    if not emq.type_ok(rtype, 'hash') then emq.refuse(emq.E.WRONGTYPE) end

    -- read and decide (emq_cancel_decide): a row that says pending is a waiting job
    if rtype == 'none' then return -1 end
    local state = emq.hget(row, rtype, 'state')
    local first = not emq.hexists(row, rtype, 'cancel_requested')
    local after = state == 'waiting' -- waiting for its dependencies (emq_deps.c): in no lane
    if state ~= 'pending' and not after then
        if emq.state_is_finished(state) then return redis.status_reply('finished') end
        -- held: store the request (only the first time) and tell the holder now; workers
        -- listen on <base>cancel and checkpoint at once, which delivers the reason
        if first then
            redis.call('HSET', row, 'cancel_requested', reason)
            -- The module publishes whatever the caller's channel permissions; a script
            -- publishes as the caller, so a caller who may not publish there stores the
            -- request unannounced: the holder's next checkpoint delivers it anyway.
            local channel = base .. 'cancel'
            if redis.acl_check_cmd('PUBLISH', channel, id) then redis.call('PUBLISH', channel, id) end
        end
        return redis.status_reply('requested')
    end
    local meta = emq.read_meta(base)
    local lanes = emq.lanes(base, pending)
    if not after then lanes:remove_row(id, row, rtype) end
    emq.ended_prepare(base, id, 'cancelled', false)

    -- apply: a waiting job is cancelled on the spot
    local at = emq.int(now)
    lanes:apply()
    if first then
        redis.call('HSET', row, 'state', 'cancelled', 'finished_at', at, 'cancel_requested', reason)
    else
        redis.call('HSET', row, 'state', 'cancelled', 'finished_at', at)
    end
    emq.ended_apply(base, id, 'cancelled', false)
    emq.retain(row, now, meta.cancelled_ttl)
    return redis.status_reply('cancelled')
end)
