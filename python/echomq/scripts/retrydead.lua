#!lua
-- include: _dead.lua
-- EMQ.RETRYDEAD <dead> <pending> <base> <limit> [UNTIL <ms>]          (module/emq_dead.c)
--
-- RETRY for the <limit> oldest members of <dead> (those that died at or before UNTIL when it
-- is given).  Reply [retried, dropped]: dropped members left <dead> without a retry because
-- their row is gone or is not dead or cancelled.  Every row is checked before the first
-- write: the batch is applied whole or not at all.
return emq.verb({ 'ZREM', 'HSET', 'HINCRBY', 'HDEL', 'PERSIST', 'ZADD', 'RPUSH' }, function()
    -- parse
    local argv, argc, max_limit = emq.args()
    if argc < 5 then emq.wrong_arity('emq.retrydead') end
    local limit = emq.parse_limit(argv[4], emq.max_limit(max_limit))
    local until_score = parse_until(argv, 5, argc)
    local dead, pending, base = argv[1], argv[2], argv[3]
    emq.check_queue(argv, 1, { 'dead', 'pending' }, base, emq.E.DEAD_PENDING_KEYS)

    -- open and type-check
    if not emq.type_ok(emq.type(dead), 'zset') or not emq.type_ok(emq.type(pending), 'list') then
        emq.refuse(emq.E.WRONGTYPE)
    end
    local batch = batch_open(dead, base, until_score, limit, emq.READ_WRITE)

    -- read and decide: no row, or a row in another state, is not a dead job: dropped
    local retried = 0
    local lanes = emq.lanes(base, pending)
    for _, d in ipairs(batch) do
        if d.rtype ~= 'none' and emq.retry_check(emq.hget(d.row, d.rtype, 'state')) == nil then
            emq.incr(emq.hget(d.row, d.rtype, 'retries'), '1', emq.E.RETRIES_NOT_INTEGER)
            lanes:place_row(d.id, d.row, d.rtype, false)
            d.act = true
            retried = retried + 1
        end
    end

    -- apply: member by member, then the lanes (one RPUSH or ZADD for all)
    for _, d in ipairs(batch) do
        if d.act then
            retry_apply(dead, d.row, d.id)
        else
            redis.call('ZREM', dead, d.id)
        end
    end
    lanes:apply()
    return { retried, #batch - retried }
end)
