-- What EMQ.COMPLETE and EMQ.COMPLETECLAIM share (module/emq_finish.c): the checks and
-- reads (nothing written: emq.complete_prepare) and the writes (emq.complete_apply).

-- The arguments' checks (before the clock is read).
function emq.complete_check(active, row, id)
    if active == row then emq.refuse(emq.E.SAME_KEY) end
    if not emq.job_key_matches(active, row, id) then emq.refuse(emq.E.JOB_KEY) end
end

-- [RESULT <bytes>] from argv[from] on: the bytes (or nil), within emq.max-result-bytes (the
-- client's max_result_bytes, `max_result`), and refused past maxmemory where `oom_check`
-- (COMPLETE is not deny-oom).
function emq.result_option(argv, argc, from, max_result, oom_check)
    local result = nil
    for i = from, argc - 1, 2 do
        if i + 1 >= argc or result or not emq.option_is(argv[i], 'RESULT') then emq.refuse(emq.E.SYNTAX) end
        result = argv[i + 1]
    end
    if result and #result > max_result then emq.refuse(emq.E.RESULT_TOO_LARGE) end
    if result and oom_check and emq.past_maxmemory() then emq.refuse(emq.E.OOM) end
    return result
end

-- Open, type-check, read and decide: { reply = 1 or -1, write = <bool>, meta = ... }.
function emq.complete_prepare(active, row, id, token, result)
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
    local base = active:sub(1, #active - #'active')
    local meta = emq.read_meta(base)
    emq.left_active_prepare(base, id)
    emq.ended_prepare(base, id, 'done', false, not meta.deps)
    return { reply = 1, write = true, meta = meta, base = base, rtype = rtype, result = result }
end

-- ZREM <active>; the old result's pieces (a row written by hand) HDEL'd; one HSET of the end and
-- the result's pieces; the announcement; the retention.
function emq.complete_apply(active, row, id, prepared, now)
    if not prepared.write then return end
    redis.call('ZREM', active, id)
    emq.left_active_apply(prepared.base, id)
    local fields = { 'state', 'done', 'finished_at', emq.int(now), 'closed_by', 'complete' }
    local pieces = prepared.result and emq.pieces(fields, 'result', prepared.result) or 0
    emq.drop_pieces(row, prepared.rtype, 'result', pieces)
    redis.call('HSET', row, unpack(fields))
    emq.ended_apply(prepared.base, id, 'done', false)
    emq.retain(row, now, prepared.meta.done_ttl)
end
