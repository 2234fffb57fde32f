#!lua
-- include: _enqueue.lua
-- EMQ.ENQUEUEMANY <pending> <base> <count> <id> <payload> [<id> <payload> ...]
--                 [DELAY <ms> | AT <unix-ms>] [REQ <request-id>]      (module/emq_enqueue.c)
--
-- :<count> every job is created as by ENQUEUE (one row each, the same due time for all), or
-- none is: -EMQEXISTS when any of the rows exists.  With REQ, one record
-- <base>req:<request-id> = "<count>" is kept for 60 s: a retry whose first reply was lost
-- answers :<count> again and writes nothing, whatever became of the jobs since.  Two equal
-- ids in one call are refused.  At most emq.max-limit jobs: the server's setting, which a
-- script cannot read, so the client's max_limit (<setting>) stands in for it.
--
-- The module adds every id with one ZADD (one "zadd" event).  A script passes a call's
-- arguments through Lua's stack, at most 8000 of them: above 3,999 jobs the ids are added
-- by one ZADD per 3,999 (one "zadd" event each), the only difference.
local ZADD_MEMBERS = 3999

return emq.verb({ 'HSET', 'ZADD', 'SET', 'PEXPIREAT' }, function()
    -- parse
    local argv, argc, max_limit = emq.args()
    if argc < 6 then emq.wrong_arity('emq.enqueuemany') end
    local pending, base = argv[1], argv[2]
    local c = emq.canonical(argv[3])
    if c == nil or emq.dec_cmp(c, '1') < 0 then emq.refuse(emq.E.MANY_COUNT) end
    if emq.dec_cmp(c, emq.int(emq.max_limit(max_limit))) > 0 then emq.refuse(emq.E.MANY_TOO_MANY) end
    local count = tonumber(c)
    if not emq.count_fits(count, 2, 4, argc) then emq.wrong_arity('emq.enqueuemany') end
    local now = emq.now_ms()
    local req, due = parse_options(argv, 4 + 2 * count, argc, now)
    emq.check_queue(argv, 1, { 'pending' }, base, emq.E.PENDING_KEY)
    local seen = {}
    for i = 0, count - 1 do
        local id = argv[4 + 2 * i]
        if seen[id] then emq.refuse(emq.E.MANY_DUPLICATE) end
        seen[id] = true
    end

    -- open and type-check: every row's ACL, and the record's, before any is read
    if not emq.type_ok(emq.type(pending), 'zset') then emq.refuse(emq.E.WRONGTYPE) end
    local rows, types = {}, {}
    for i = 1, count do
        rows[i] = base .. 'job:' .. argv[2 + 2 * i]
        types[i] = emq.open_derived(rows[i], emq.CREATE)
    end
    local record, retry = open_record(base, req)

    -- read and decide: a retry of this very call, all new, or refused
    if retry then return count end
    for i = 1, count do
        if types[i] ~= 'none' then emq.refuse(emq.E.EXISTS) end
    end

    -- apply: the rows, then the ids, then the record
    for i = 1, count do
        write_row(rows[i], argv[3 + 2 * i], now)
    end
    local at, args = emq.int(due), {}
    for i = 1, count do
        args[#args + 1] = at
        args[#args + 1] = argv[2 + 2 * i]
        if i % ZADD_MEMBERS == 0 or i == count then
            redis.call('ZADD', pending, unpack(args))
            args = {}
        end
    end
    if record then write_record(record, count, now) end
    return count
end)
