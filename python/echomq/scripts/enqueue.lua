#!lua
-- include: _enqueue.lua
-- EMQ.ENQUEUE <pending> <base> <id> <payload> [DELAY <ms> | AT <unix-ms>] [REQ <request-id>]
--                                                                    (module/emq_enqueue.c)
--
-- :1 the row <base>job:<id> is created (state=pending, attempts=0, tries=0, payload,
-- enqueued_at) and <id> waits in <pending>, claimable from server-now (+ DELAY ms, or from
-- AT; an AT in the past is now); with REQ, the record <base>req:<request-id> = "1" is kept
-- for 60 s.  -EMQEXISTS when the row exists.  A retry whose first reply was lost (the record
-- exists) answers :1 again and writes nothing, whatever became of the job since.
return emq.verb({ 'HSET', 'ZADD', 'SET', 'PEXPIREAT' }, function()
    -- parse
    local argv, argc = emq.args()
    if argc < 5 then emq.wrong_arity('emq.enqueue') end
    local pending, base, id, payload = argv[1], argv[2], argv[3], argv[4]
    local now = emq.now_ms()
    local req, due = parse_options(argv, 5, argc, now)
    emq.check_queue(argv, 1, { 'pending' }, base, emq.E.PENDING_KEY)

    -- open and type-check: the row's and the record's ACL before they are read
    if not emq.type_ok(emq.type(pending), 'zset') then emq.refuse(emq.E.WRONGTYPE) end
    local row = base .. 'job:' .. id
    local rtype = emq.open_derived(row, emq.CREATE)
    local record, retry = open_record(base, req)

    -- read and decide: a retry of this very call, a taken id, or a new job
    if retry then return 1 end
    if rtype ~= 'none' then emq.refuse(emq.E.EXISTS) end

    -- apply
    write_row(row, payload, now)
    redis.call('ZADD', pending, emq.int(due), id)
    if record then write_record(record, 1, now) end
    return 1
end)
