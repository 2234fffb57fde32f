#!lua
-- include: _enqueue.lua
-- EMQ.ENQUEUE <pending> <base> <id> <payload> [DELAY <ms> | AT <unix-ms>] [REQ <request-id>]
--                                                                    (module/emq_enqueue.c)
--
-- :1 the row <base>job:<id> is created (state=pending, attempts=0, tries=0, payload,
-- enqueued_at) and <id> waits in <pending>, claimable from server-now (+ DELAY ms, or from
-- AT; an AT in the past is now).  -EMQEXISTS when the row exists -- unless it was created
-- by this very request (same REQ): a retry whose first reply was lost answers :1 again and
-- writes nothing.
return emq.verb({ 'HSET', 'ZADD' }, function()
    -- parse
    local argv, argc = emq.args()
    if argc < 5 then emq.wrong_arity('emq.enqueue') end
    local pending, base, id, payload = argv[1], argv[2], argv[3], argv[4]
    local now = emq.now_ms()
    local req, due = parse_options(argv, 5, argc, now)
    emq.check_queue(argv, 1, { 'pending' }, base, emq.E.PENDING_KEY)

    -- open and type-check: the row's ACL before it is read
    if not emq.type_ok(emq.type(pending), 'zset') then emq.refuse(emq.E.WRONGTYPE) end
    local row = base .. 'job:' .. id
    local rtype = emq.open_derived(row, emq.CREATE)

    -- read and decide
    if rtype ~= 'none' then
        if made_by(row, rtype, req) then return 1 end
        emq.refuse(emq.E.EXISTS)
    end

    -- apply
    write_row(row, payload, now, req)
    redis.call('ZADD', pending, emq.int(due), id)
    return 1
end)
