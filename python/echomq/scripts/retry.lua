#!lua
-- include: _dead.lua
-- EMQ.RETRY <dead> <pending> <base> <id>                               (module/emq_dead.c)
--
-- +pending  the dead or cancelled job waits at the tail of its lane again with a fresh
--           budget: tries=0 stalled=0, retries+1; cancel_requested, closed_by and
--           finished_at are gone and the row expires no more.
-- :-1       no such row.
-- -EMQSTATE the job is pending, active, done or in no known state.
return emq.verb({ 'ZREM', 'HSET', 'HINCRBY', 'HDEL', 'PERSIST', 'ZADD', 'RPUSH' }, function()
    -- parse
    local argv, argc = emq.args()
    if argc ~= 5 then emq.wrong_arity('emq.retry') end
    local dead, pending, base = argv[1], argv[2], argv[3]
    emq.check_queue(argv, 1, { 'dead', 'pending' }, base, emq.E.DEAD_PENDING_KEYS)
    local id = argv[4]

    -- open and type-check: the derived row's ACL before it is read
    if not emq.type_ok(emq.type(dead), 'zset') or not emq.type_ok(emq.type(pending), 'list') then
        emq.refuse(emq.E.WRONGTYPE)
    end
    local row = base .. 'job:' .. id
    local rtype = emq.open_derived(row, emq.READ_WRITE)
    if not emq.type_ok(rtype, 'hash') then emq.refuse(emq.E.WRONGTYPE) end

    -- read and decide
    if rtype == 'none' then return -1 end
    local refusal = emq.retry_check(emq.hget(row, rtype, 'state'))
    if refusal then emq.refuse(refusal) end
    emq.incr(emq.hget(row, rtype, 'retries'), '1', emq.E.RETRIES_NOT_INTEGER)
    local lanes = emq.lanes(base, pending)
    lanes:place_row(id, row, rtype, false)

    -- apply
    retry_apply(dead, row, id)
    lanes:apply()
    return redis.status_reply('pending')
end)
