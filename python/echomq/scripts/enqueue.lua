#!lua
-- EMQ.ENQUEUE <pending> <base> <id> <payload> [REQ <request-id>]      (module/emq_enqueue.c)
--
-- :1 the row <base>job:<id> is created (state=pending, attempts=0, tries=0, payload,
-- enqueued_at) and <id> waits in <pending>, scored with server-now.  -EMQEXISTS when the row
-- exists -- unless it was created by this very request (same REQ): a retry whose first reply
-- was lost answers :1 again and writes nothing.
return emq.run({ 'HSET', 'ZADD' }, function()
    -- parse
    local argv, argc = emq.args()
    if argc < 5 then emq.wrong_arity('emq.enqueue') end
    local id, payload, req = argv[3], argv[4], nil
    for i = 5, argc - 1, 2 do
        if i + 1 >= argc or req or not emq.option_is(argv[i], 'REQ') then emq.refuse(emq.E.SYNTAX) end
        req = argv[i + 1]
        if #req == 0 then emq.refuse(emq.E.REQ_EMPTY) end
    end
    local pending, base = argv[1], argv[2]
    emq.check_queue(argv, 1, { 'pending' }, base, emq.E.PENDING_KEY)
    local now = emq.now_ms()

    -- open and type-check: the row's ACL before it is read
    if not emq.type_ok(emq.type(pending), 'zset') then emq.refuse(emq.E.WRONGTYPE) end
    local row = base .. 'job:' .. id
    local rtype = emq.open_derived(row, emq.CREATE)

    -- read and decide
    if rtype ~= 'none' then
        local first = req and emq.hget(row, rtype, 'request')
        if first and first == req then return 1 end
        emq.refuse(emq.E.EXISTS)
    end

    -- apply: one HSET, as the core command would be; the request id only when given
    if req then
        redis.call('HSET', row, 'state', 'pending', 'attempts', '0', 'tries', '0', 'payload', payload,
            'enqueued_at', emq.int(now), 'request', req)
    else
        redis.call('HSET', row, 'state', 'pending', 'attempts', '0', 'tries', '0', 'payload', payload,
            'enqueued_at', emq.int(now))
    end
    redis.call('ZADD', pending, emq.int(now), id)
    return 1
end)
