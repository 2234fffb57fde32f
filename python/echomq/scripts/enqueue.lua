#!lua
-- include: _enqueue.lua
-- EMQ.ENQUEUE <pending> <base> <id> <payload> [DELAY <ms> | AT <unix-ms>] [PRIORITY <n>]
--             [REQ <request-id>]                                      (module/emq_enqueue.c)
--
-- :1 the row <base>job:<id> is created (state=pending, payload and its pieces, enqueued_at,
-- priority unless 0) and <id> waits at the tail of its lane, claimable from server-now -- or
-- in <base>delayed until server-now + DELAY ms, or AT (an AT in the past is now); with REQ,
-- the record <base>req:<request-id> = "1" is kept for 60 s.  -EMQEXISTS when the row exists.
-- A retry whose first reply was lost (the record exists) answers :1 again and writes nothing,
-- whatever became of the job since.  <setting>: the client's max_payload_bytes.
return emq.verb({ 'HSET', 'RPUSH', 'ZADD', 'SET', 'PEXPIREAT' }, function()
    -- parse
    local argv, argc, setting = emq.args()
    if argc < 5 then emq.wrong_arity('emq.enqueue') end
    local _, max_payload = enqueue_setting(setting)
    local pending, base, id, payload = argv[1], argv[2], argv[3], argv[4]
    local now = emq.now_ms()
    local req, due, level = parse_options(argv, 5, argc, now)
    check_payload(payload, max_payload)
    emq.check_queue(argv, 1, { 'pending' }, base, emq.E.PENDING_KEY)

    -- open and type-check: the row's and the record's ACL before they are read
    if not emq.type_ok(emq.type(pending), 'list') then emq.refuse(emq.E.WRONGTYPE) end
    local row = base .. 'job:' .. id
    local rtype = emq.open_derived(row, emq.CREATE)
    local record, retry = open_record(base, req)

    -- read and decide: a retry of this very call, a taken id, or a new job -- and where it waits
    if retry then return 1 end
    if rtype ~= 'none' then emq.refuse(emq.E.EXISTS) end
    local lanes = emq.lanes(base, pending)
    lanes:enter(id, level, due, now)

    -- apply
    write_row(row, payload, now, level)
    lanes:apply()
    if record then write_record(record, 1, now) end
    return 1
end)
