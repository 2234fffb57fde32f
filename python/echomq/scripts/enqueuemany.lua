#!lua
-- include: _enqueue.lua
-- EMQ.ENQUEUEMANY <pending> <base> <count> <id> <payload> [<id> <payload> ...]
--                 [DELAY <ms> | AT <unix-ms>] [PRIORITY <n>] [GROUP <g>] [REQ <request-id>]
--                                                                    (module/emq_enqueue.c)
--
-- :<count> every job is created as by ENQUEUE (one row each, the same due time and level for
-- all, entering the lane in argument order), or none is: -EMQEXISTS when any of the rows exists.  With REQ, one record
-- <base>req:<request-id> = "<count>" is kept for 60 s: a retry whose first reply was lost
-- answers :<count> again and writes nothing, whatever became of the jobs since.  Two equal
-- ids in one call are refused.  At most emq.max-limit jobs, each payload at most
-- emq.max-payload-bytes: the server's settings, which a script cannot read, so the client's
-- (<setting>: "<max-limit> <max-payload-bytes>") stand in for them.
--
-- The module adds every id with one RPUSH or ZADD (one event).  A script passes a call's
-- arguments through Lua's stack, at most 8000 of them: above 3,999 jobs the ids are added
-- by one command per 3,999 (one event each), the only difference.
return emq.verb({ 'HSET', 'RPUSH', 'ZADD', 'SET', 'PEXPIREAT' }, function()
    -- parse
    local argv, argc, setting = emq.args()
    if argc < 6 then emq.wrong_arity('emq.enqueuemany') end
    local max_limit, max_payload = enqueue_setting(setting)
    local pending, base = argv[1], argv[2]
    local c = emq.canonical(argv[3])
    if c == nil or emq.dec_cmp(c, '1') < 0 then emq.refuse(emq.E.MANY_COUNT) end
    if emq.dec_cmp(c, emq.int(max_limit)) > 0 then emq.refuse(emq.E.MANY_TOO_MANY) end
    local count = tonumber(c)
    if not emq.count_fits(count, 2, 4, argc) then emq.wrong_arity('emq.enqueuemany') end
    local now = emq.now_ms()
    local req, due, level, group = parse_options(argv, 4 + 2 * count, argc, now, nil)
    for i = 0, count - 1 do check_payload(argv[5 + 2 * i], max_payload) end
    emq.check_queue(argv, 1, { 'pending' }, base, emq.E.PENDING_KEY)
    local seen = {}
    for i = 0, count - 1 do
        local id = argv[4 + 2 * i]
        if seen[id] then emq.refuse(emq.E.MANY_DUPLICATE) end
        seen[id] = true
    end

    -- open and type-check: every row's ACL, and the record's, before any is read
    if not emq.type_ok(emq.type(pending), 'list') then emq.refuse(emq.E.WRONGTYPE) end
    local rows, types = {}, {}
    for i = 1, count do
        rows[i] = base .. 'job:' .. argv[2 + 2 * i]
        types[i] = emq.open_derived(rows[i], emq.CREATE)
    end
    local record, retry = open_record(base, req)
    local registry, registered = open_registry(base, pending)

    -- read and decide: a retry of this very call, all new, or refused; and where they wait
    if retry then return count end
    for i = 1, count do
        if types[i] ~= 'none' then emq.refuse(emq.E.EXISTS) end
    end
    local lanes = emq.lanes(base, pending)
    for i = 1, count do
        lanes:enter_in(argv[2 + 2 * i], group, level, due, now)
    end

    -- apply: the rows, then the lane (one RPUSH or ZADD), then the record
    for i = 1, count do
        write_row(rows[i], argv[3 + 2 * i], now, level, group)
    end
    lanes:apply()
    mark_registry(registry, registered)
    if record then write_record(record, count, now) end
    return count
end)
