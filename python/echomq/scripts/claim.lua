#!lua
-- EMQ.CLAIM <pending> <active> <base> <lease-ms> [COUNT <n>] [REQ <request-id>] [BLOCK <ms>]
--                                                                      (module/emq_claim.c)
--
-- Reply: an array of up to <n> (default 1, at most 1000) jobs, each [id, token, payload,
-- attempt, state], oldest first; null when nothing is claimable (the queue is empty, every
-- waiting job is delayed, or the queue is paused): nothing was written then.  With REQ, a
-- retry of the same request answers the jobs that request claimed and still holds.
--
-- The token is "<attempts>-<16 hex>", as the module makes it.  The module draws 8 random
-- bytes per job; a script cannot: math.random is one fixed sequence, started from the same
-- seed by every server (Redis 7, Valkey 8; older servers even reseeded it before every
-- call), so its "random" parts are predictable, and a replica promoted after a failover
-- would hand out again the very parts the old master did -- with the same counters, for
-- the claims the failover lost.  The client sends 8 fresh random bytes with every call
-- instead (the nonce, <setting>, from os.urandom), and job i of the call gets the first 16
-- hex digits of SHA1(nonce ":" i).  The counter says which claim of the job it is; the
-- random part differs from that of every other claim of the job (each call has its own
-- nonce; the jobs of one call differ by i), also from a claim a failover made the server
-- forget, whose counter repeats; and it cannot be guessed without the nonce.
local MAX_CLAIM_COUNT = 1000

-- emq_core.c: emq_record_item_size / emq_record_put / emq_record_next.  A claim's request
-- record is its items (id, token, id, token, ...), each "<length>:<bytes>".
local function record_put(out, item)
    out[#out + 1] = #item .. ':' .. item
end

-- The items of a record, or nil when it is not a record of ours.
local function record_items(rec)
    local items, pos, len = {}, 1, #rec
    while pos <= len do
        local start, v = pos, 0
        while pos <= len and pos - start < 12 do
            local c = rec:byte(pos)
            if c < 48 or c > 57 then break end
            v = v * 10 + c - 48
            pos = pos + 1
        end
        if pos == start or pos > len or rec:sub(pos, pos) ~= ':' then return nil end
        pos = pos + 1
        if v > len - pos + 1 then return nil end
        items[#items + 1] = rec:sub(pos, pos + v - 1)
        pos = pos + v
    end
    return items
end

-- [id, token, payload, attempt, state]: the attempt is `tries` (this claim's number within
-- the job's retry budget), the state its last checkpoint's (false: a null reply).
local function job_reply(row, id, token, tries)
    local fields = redis.call('HMGET', row, 'payload', 'checkpoint')
    return { id, token, fields[1] or '', tonumber(tries), fields[2] }
end

-- A retry of a request whose claim went through: the jobs it took that this request still
-- holds (same token, still active); others were lost since and are left out.  Writes
-- nothing.
local function reanswer(active, base, rec)
    local items = record_items(rec)
    if items == nil or #items % 2 == 1 then return false end -- not a record of ours
    local jobs = {}
    for k = 1, #items, 2 do
        local id, tok = items[k], items[k + 1]
        if #tok < 48 then
            local row = base .. 'job:' .. id
            local rtype = emq.open_derived(row, emq.READ)
            local current = emq.hget(row, rtype, 'token')
            if current == tok and redis.call('ZSCORE', active, id) then
                local tries = emq.canonical(emq.hget(row, rtype, 'tries')) or '0'
                jobs[#jobs + 1] = job_reply(row, id, tok, tries)
            end
        end
    end
    return #jobs > 0 and jobs or false
end

return emq.verb({ 'ZREM', 'HINCRBY', 'HSET', 'HDEL', 'ZADD', 'HMGET', 'SET', 'PEXPIREAT' }, function()
    -- parse
    local argv, argc, nonce = emq.args()
    if argc < 5 then emq.wrong_arity('emq.claim') end
    local now = emq.now_ms()
    local count, req, seen_count, block = 1, nil, false, nil
    for i = 5, argc - 1, 2 do
        if i + 1 >= argc then emq.refuse(emq.E.SYNTAX) end
        local opt, val = argv[i], argv[i + 1]
        if emq.option_is(opt, 'COUNT') and not seen_count then
            seen_count = true
            count = emq.parse_count(val, emq.E.CLAIM_COUNT)
        elseif emq.option_is(opt, 'REQ') and not req then
            if #val == 0 then emq.refuse(emq.E.REQ_EMPTY) end
            req = val
        elseif emq.option_is(opt, 'BLOCK') and not block then
            -- checked as the module checks it; a script never waits (no script may block):
            -- it answers at once, as the module does inside MULTI or a script, and the
            -- client waits by polling (python/echomq/_scripts.py, ClaimPoll)
            block = emq.parse_block(now, val)
        else
            emq.refuse(emq.E.SYNTAX)
        end
    end
    local pending, active, base = argv[1], argv[2], argv[3]
    emq.check_queue(argv, 1, { 'pending', 'active' }, base, emq.E.PENDING_ACTIVE_KEYS)
    if count > MAX_CLAIM_COUNT then count = MAX_CLAIM_COUNT end
    local deadline = emq.lease_deadline(now, argv[4])

    -- open and type-check
    if not emq.type_ok(emq.type(pending), 'zset') or not emq.type_ok(emq.type(active), 'zset') then
        emq.refuse(emq.E.WRONGTYPE)
    end
    local record, rectype
    if req then
        record = base .. 'req:' .. req
        rectype = emq.open_derived(record, emq.READ_WRITE)
        if not emq.type_ok(rectype, 'string') then emq.refuse(emq.E.WRONGTYPE) end
    end

    -- read and decide
    if req and rectype ~= 'none' then
        return reanswer(active, base, redis.call('GET', record))
    end
    local meta = emq.read_meta(base)
    if meta.paused then return false end
    -- collect up to `count` claimable heads and check every row before anything is
    -- written: the claim takes all of them or none
    local ids = emq.zset_head(pending, emq.int(now), count)
    local jobs = {}
    for i, id in ipairs(ids) do
        local row = base .. 'job:' .. id
        local rtype = emq.open_derived(row, emq.READ_WRITE)
        if not emq.type_ok(rtype, 'hash') then emq.refuse(emq.E.WRONGTYPE) end
        -- a row that vanished while its id waited starts at attempt 1
        local attempts = emq.incr(emq.hget(row, rtype, 'attempts'), '1', emq.E.ATTEMPTS_NOT_INTEGER)
        local tries = emq.incr(emq.hget(row, rtype, 'tries'), '1', emq.E.TRIES_NOT_INTEGER)
        local token = attempts .. '-' .. redis.sha1hex(nonce .. ':' .. i):sub(1, 16)
        jobs[i] = { id = id, row = row, tries = tries, token = token }
    end
    if #jobs == 0 then return false end

    -- apply, job by job, in the module's order of writes (and so of keyspace events)
    local reply, rec = {}, {}
    for i, j in ipairs(jobs) do
        redis.call('ZREM', pending, j.id)
        redis.call('HINCRBY', j.row, 'attempts', 1)
        redis.call('HSET', j.row, 'tries', j.tries, 'token', j.token, 'state', 'active', 'claimed_at', emq.int(now))
        redis.call('HDEL', j.row, 'closed_by') -- fires "hdel" only when it was there, as the module's
        redis.call('ZADD', active, emq.int(deadline), j.id)
        reply[i] = job_reply(j.row, j.id, j.token, j.tries)
        record_put(rec, j.id)
        record_put(rec, j.token)
    end
    if record then
        -- remembered as long as the lease: a retry after that finds the jobs lapsed anyway
        redis.call('SET', record, table.concat(rec))
        redis.call('PEXPIREAT', record, emq.int(deadline))
    end
    return reply
end)
