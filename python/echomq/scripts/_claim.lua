-- What EMQ.CLAIM and EMQ.COMPLETECLAIM share (module/emq_claim.c): the options, the
-- claim's checks and reads (nothing written: emq.claim_prepare), and its writes
-- (emq.claim_apply).
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

-- The options from argv[first] on (BLOCK only where `block`), in the order the errors are
-- answered: count, req.
function emq.claim_options(argv, argc, first, block, now)
    local count, req, seen_count, seen_block = 1, nil, false, false
    for i = first, argc - 1, 2 do
        if i + 1 >= argc then emq.refuse(emq.E.SYNTAX) end
        local opt, val = argv[i], argv[i + 1]
        if emq.option_is(opt, 'COUNT') and not seen_count then
            seen_count = true
            count = emq.parse_count(val, emq.E.CLAIM_COUNT)
        elseif emq.option_is(opt, 'REQ') and not req then
            if #val == 0 then emq.refuse(emq.E.REQ_EMPTY) end
            req = val
        elseif block and emq.option_is(opt, 'BLOCK') and not seen_block then
            -- checked as the module checks it; a script never waits (no script may block):
            -- it answers at once, as the module does inside MULTI or a script, and the
            -- client waits by polling (python/echomq/_scripts.py, ClaimPoll)
            seen_block = true
            emq.parse_block(now, val)
        else
            emq.refuse(emq.E.SYNTAX)
        end
    end
    if count > MAX_CLAIM_COUNT then count = MAX_CLAIM_COUNT end
    return count, req
end

-- Open, type-check, read and decide, writing nothing: { answer = <reply> } (a retry's jobs,
-- or false: nothing claimable) or { jobs = <to apply>, record = <name or nil> }.
function emq.claim_prepare(pending, active, base, count, req, now, nonce)
    if not emq.type_ok(emq.type(pending), 'zset') or not emq.type_ok(emq.type(active), 'zset') then
        emq.refuse(emq.E.WRONGTYPE)
    end
    local record, rectype
    if req then
        record = base .. 'req:' .. req
        rectype = emq.open_derived(record, emq.READ_WRITE)
        if not emq.type_ok(rectype, 'string') then emq.refuse(emq.E.WRONGTYPE) end
    end
    if req and rectype ~= 'none' then
        return { answer = reanswer(active, base, redis.call('GET', record)) }
    end
    local meta = emq.read_meta(base)
    if meta.paused then return { answer = false } end
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
    if #jobs == 0 then return { answer = false } end
    return { jobs = jobs, record = record }
end

-- The writes, job by job, in the module's order (and so of keyspace events); the reply.
function emq.claim_apply(pending, active, prepared, now, deadline)
    local reply, rec = {}, {}
    for i, j in ipairs(prepared.jobs) do
        redis.call('ZREM', pending, j.id)
        redis.call('HINCRBY', j.row, 'attempts', 1)
        redis.call('HSET', j.row, 'tries', j.tries, 'token', j.token, 'state', 'active', 'claimed_at', emq.int(now))
        redis.call('HDEL', j.row, 'closed_by') -- fires "hdel" only when it was there, as the module's
        redis.call('ZADD', active, emq.int(deadline), j.id)
        reply[i] = job_reply(j.row, j.id, j.token, j.tries)
        record_put(rec, j.id)
        record_put(rec, j.token)
    end
    if prepared.record then
        -- remembered as long as the lease: a retry after that finds the jobs lapsed anyway
        redis.call('SET', prepared.record, table.concat(rec))
        redis.call('PEXPIREAT', prepared.record, emq.int(deadline))
    end
    return reply
end
