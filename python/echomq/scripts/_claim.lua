-- What EMQ.CLAIM and EMQ.COMPLETECLAIM share (module/emq_claim.c): the options, the
-- claim's checks and reads (nothing written: emq.claim_prepare), and its writes
-- (emq.claim_apply).
local MAX_CLAIM_COUNT = 1000

-- emq_core.c: emq_record_item_size / emq_record_put / emq_record_next.  A claim's request
-- record is its items (id, token, id, token, ...), each "<length>:<bytes>".
local function record_put(out, item)
    out[#out + 1] = #item .. ':' .. item
end

-- A record read a window at a time (GETRANGE), never whole: a forged record of any size costs
-- no more reads than a real one of EMQ_MAX_CLAIM_COUNT jobs (the module reads it in place).
-- bytes(from, n): n bytes at 0-based offset `from` (the caller keeps within the record).
local WINDOW = 4096
local function record_reader(key)
    local size, first, buf = redis.call('STRLEN', key), 0, ''
    local function bytes(from, n)
        if n == 0 then return '' end
        if from < first or from + n > first + #buf then
            first = from
            buf = redis.call('GETRANGE', key, from, from + math.max(n, WINDOW) - 1)
        end
        return buf:sub(from - first + 1, from - first + n)
    end
    return size, bytes
end

-- emq_claim_record_check: the (id offset, id length, token) of each pair of a claim's record,
-- checked whole before anything is made of it -- at least one and at most MAX_CLAIM_COUNT
-- pairs, every item within the record, every token 1 to 47 bytes -- or the refusal.
local function record_pairs(key)
    local size, bytes = record_reader(key)
    local pairs_, pos, items, id_at, id_len = {}, 0, 0, 0, 0
    while pos < size do
        local head = bytes(pos, math.min(13, size - pos))
        local digits = head:match('^(%d+):')
        if digits == nil or #digits > 12 then emq.refuse(emq.E.REQ_RECORD) end
        local v, at = tonumber(digits), pos + #digits + 1
        if v > size - at then emq.refuse(emq.E.REQ_RECORD) end
        items = items + 1
        if items > 2 * MAX_CLAIM_COUNT then emq.refuse(emq.E.REQ_RECORD) end
        if items % 2 == 1 then
            id_at, id_len = at, v
        else
            if v == 0 or v >= 48 then emq.refuse(emq.E.REQ_RECORD) end
            pairs_[#pairs_ + 1] = { id_at = id_at, id_len = id_len, token = bytes(at, v) }
        end
        pos = at + v
    end
    if items == 0 or items % 2 == 1 then emq.refuse(emq.E.REQ_RECORD) end
    return pairs_, bytes
end

-- [id, token, payload, attempt, state]: the attempt is `tries` (this claim's number within
-- the job's retry budget), the state its last checkpoint's (false: a null reply).
local function job_reply(row, id, token, tries)
    local fields = redis.call('HMGET', row, 'payload', 'checkpoint')
    return { id, token, fields[1] or '', tonumber(tries), fields[2] }
end

-- A retry of a request whose claim went through: the jobs it took that this request still
-- holds (same token, still active); others were lost since and are left out.  `done` is the
-- job COMPLETECLAIM's complete half ends in this very call (nil for CLAIM): no longer held
-- once the call applies, so never answered.  A malformed record (or another call's) is
-- refused.  Writes nothing.
local function reanswer(active, base, record, done)
    local pairs_, bytes = record_pairs(record)
    local jobs = {}
    for _, p in ipairs(pairs_) do
        local id, tok = bytes(p.id_at, p.id_len), p.token
        local row = base .. 'job:' .. id
        local rtype = emq.open_derived(row, emq.READ)
        local current = emq.hget(row, rtype, 'token')
        if current == tok and redis.call('ZSCORE', active, id) and id ~= done then
            local tries = emq.canonical(emq.hget(row, rtype, 'tries')) or '0'
            jobs[#jobs + 1] = job_reply(row, id, tok, tries)
        end
    end
    return #jobs > 0 and jobs or false
end

-- A claim's <setting>: "<nonce> <max-limit>", the random part of its tokens and the server's
-- emq.max-limit as the client knows it (python/echomq/_scripts.py, setting).
function emq.claim_setting(setting)
    local nonce, limit = (setting or ''):match('^(%S*) ?(.*)$')
    return nonce, emq.max_limit(limit)
end

-- The options from argv[first] on (BLOCK only where `block`), in the order the errors are
-- answered: count, req.  COUNT above the ceiling claims this many: 1000, or the server's
-- emq.max-limit when that is lower.
function emq.claim_options(argv, argc, first, block, now, max_limit)
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
    count = math.min(count, MAX_CLAIM_COUNT, max_limit)
    return count, req
end

-- Open, type-check, read and decide, writing nothing: { answer = <reply> } (a retry's jobs,
-- or false: nothing claimable) or { jobs = <to apply>, record = <name or nil> }.  `done`: the
-- job COMPLETECLAIM completes in the same call (nil for CLAIM).
function emq.claim_prepare(pending, active, base, count, req, now, nonce, done)
    if not emq.type_ok(emq.type(pending), 'zset') or not emq.type_ok(emq.type(active), 'zset') then
        emq.refuse(emq.E.WRONGTYPE)
    end
    local record, rectype
    if req then
        record = base .. 'req:' .. req
        rectype = emq.open_derived(record, emq.RECORD)
        if not emq.type_ok(rectype, 'string') then emq.refuse(emq.E.WRONGTYPE) end
    end
    if req and rectype ~= 'none' then
        return { answer = reanswer(active, base, record, done) }
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
