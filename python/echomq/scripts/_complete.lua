-- What EMQ.COMPLETE and EMQ.COMPLETECLAIM share (module/emq_finish.c): the checks and
-- reads (nothing written: emq.complete_prepare) and the writes (emq.complete_apply).

-- The arguments' checks (before the clock is read).
function emq.complete_check(active, row, id)
    if active == row then emq.refuse(emq.E.SAME_KEY) end
    if not emq.job_key_matches(active, row, id) then emq.refuse(emq.E.JOB_KEY) end
end

-- Open, type-check, read and decide: { reply = 1 or -1, write = <bool>, meta = ... }.
function emq.complete_prepare(active, row, id, token)
    local rtype = emq.type(row)
    if not emq.type_ok(emq.type(active), 'zset') or not emq.type_ok(rtype, 'hash') then
        emq.refuse(emq.E.WRONGTYPE)
    end
    local holder, retry = emq.check_holder_or_retry(active, row, rtype, id, token, 'complete')
    if holder == emq.HOLDER_GONE then return { reply = -1, write = false } end
    if holder ~= emq.HOLDER_OK then
        if retry then return { reply = 1, write = false } end
        emq.refuse(emq.holder_error('complete', holder))
    end
    return { reply = 1, write = true, meta = emq.read_meta(active:sub(1, #active - #'active')) }
end

function emq.complete_apply(active, row, id, prepared, now)
    if not prepared.write then return end
    redis.call('ZREM', active, id)
    redis.call('HSET', row, 'state', 'done', 'finished_at', emq.int(now), 'closed_by', 'complete')
    emq.retain(row, now, prepared.meta.done_ttl)
end
