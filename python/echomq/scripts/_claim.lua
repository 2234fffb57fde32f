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
-- the job's retry budget), the state its last checkpoint's (false: a null reply).  The payload's
-- pieces joined (emq.row_value).
local function job_reply(row, id, token, tries)
    local rtype = emq.type(row)
    local state = rtype == 'hash' and redis.call('HGET', row, 'checkpoint') or false
    return { id, token, emq.row_value(row, rtype, 'payload') or '', tonumber(tries), state }
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

-- A claim's <setting>: "<nonce> <max-limit> [<max-result-bytes>]", the random part of its tokens
-- and the server's emq.max-limit (and emq.max-result-bytes, for COMPLETECLAIM's RESULT) as the
-- client knows them (python/echomq/_scripts.py, setting).
function emq.claim_setting(setting)
    local nonce, limit, result = (setting or ''):match('^(%S*) ?(%S*) ?(.*)$')
    return nonce, emq.max_limit(limit), emq.max_bytes(result)
end

-- The options from argv[first] on (BLOCK only where `block`, RESULT where `max_result`: COMPLETECLAIM),
-- in the order the errors are answered: count, req, result.  COUNT above the ceiling claims this
-- many: 1000, or the server's emq.max-limit when that is lower.
function emq.claim_options(argv, argc, first, block, now, max_limit, max_result)
    local count, req, result, seen_count, seen_block = 1, nil, nil, false, false
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
        elseif max_result and emq.option_is(opt, 'RESULT') and not result then
            if #val > max_result then emq.refuse(emq.E.RESULT_TOO_LARGE) end
            result = val
        else
            emq.refuse(emq.E.SYNTAX)
        end
    end
    count = math.min(count, MAX_CLAIM_COUNT, max_limit)
    return count, req, result
end

-- The counters of a job taken: its row opened for writing, the claim's number and the try's.
local function count_claim(claim, id, row, rtype)
    if not emq.type_ok(rtype, 'hash') then emq.refuse(emq.E.WRONGTYPE) end
    local attempts = emq.incr(emq.hget(row, rtype, 'attempts'), '1', emq.E.ATTEMPTS_NOT_INTEGER)
    local tries = emq.incr(emq.hget(row, rtype, 'tries'), '1', emq.E.TRIES_NOT_INTEGER)
    local i = #claim.jobs + 1
    local token = attempts .. '-' .. redis.sha1hex(claim.nonce .. ':' .. i):sub(1, 16)
    claim.jobs[i] = { id = id, row = row, tries = tries, token = token }
    claim.taken[id] = true
end

-- Take a job a promotion moved: its row said pending.
local function take(claim, id)
    if claim.taken[id] then return end
    local row = claim.base .. 'job:' .. id
    count_claim(claim, id, row, emq.open_derived(row, emq.READ_WRITE))
end

-- A member of <base>priority, which leaves it either way: taken when its row exists and says
-- pending (emq_member_live), else dropped (false): no row is nothing to run.
local function take_member(claim, id)
    if claim.taken[id] then return false end
    local row = claim.base .. 'job:' .. id
    local rtype = emq.open_derived(row, emq.READ_WRITE)
    if not emq.type_ok(rtype, 'hash') then emq.refuse(emq.E.WRONGTYPE) end
    local live = rtype == 'hash' and emq.hget(row, rtype, 'state') == 'pending'
    if live then count_claim(claim, id, row, rtype) end
    return live
end

-- An entry of <pending>: taken when live (emq_entry_live), else a tombstone (false).
local function take_if_live(claim, id)
    if claim.taken[id] then return false end
    local row = claim.base .. 'job:' .. id
    local rtype = emq.open_derived(row, emq.READ_WRITE)
    if not emq.type_ok(rtype, 'hash') then emq.refuse(emq.E.WRONGTYPE) end
    local live = rtype == 'hash' and emq.hget(row, rtype, 'state') == 'pending'
        and not emq.hexists(row, rtype, 'priority') and not claim.lanes:is_delayed(id)
    if live then count_claim(claim, id, row, rtype) end
    return live
end

-- <base>priority as it will be once the promotion is applied: its members (read a window at a
-- time, by rank) merged with the promoted ones, by score.
local function priority_stream(lanes)
    local promoted = lanes.promoted_priority
    table.sort(promoted, function(a, b) return a.score < b.score end)
    local window, first, rank, next_promoted = {}, 0, 0, 1
    local function head()
        if lanes.types.priority ~= 'zset' then return nil end
        if rank < first or rank >= first + #window / 2 then
            first = rank
            window = redis.call('ZRANGE', lanes.priority, rank, rank + 63, 'WITHSCORES')
        end
        local at = (rank - first) * 2 + 1
        if window[at] == nil then return nil end
        return window[at], tonumber(window[at + 1])
    end
    local stream = {}
    -- the level of the next job (nil: none)
    function stream.level()
        local id, score = head()
        local p = promoted[next_promoted]
        if p and (id == nil or p.score < score) then return emq.priority_level(p.score) end
        if id == nil then return nil end
        return emq.priority_level(score)
    end
    -- the next job, which leaves <base>priority at apply
    function stream.take()
        local id, score = head()
        local p = promoted[next_promoted]
        if p and (id == nil or p.score < score) then
            id, next_promoted = p.id, next_promoted + 1
        else
            rank = rank + 1
        end
        lanes.leave_priority[#lanes.leave_priority + 1] = { id = id }
        return id
    end
    return stream
end

-- Open, type-check, read and decide, writing nothing: { answer = <reply> } (a retry's jobs) or
-- { jobs = <to apply, maybe none>, lanes = ..., record = <name or nil>, due = <when to look
-- again> }.  `done`: the job COMPLETECLAIM completes in the same call (nil for CLAIM).
function emq.claim_prepare(pending, active, base, count, req, now, nonce, done)
    if not emq.type_ok(emq.type(pending), 'list') or not emq.type_ok(emq.type(active), 'zset') then
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
    -- the rate limit and back-off (_flow.lua): refused, a claim writes nothing
    local flow, allowance, reopen = emq.flow_claim_prepare(base, now)
    if allowance == 0 then return { answer = false, due = reopen } end
    if allowance > 0 and allowance < count then count = allowance end
    -- promote what is due, then take up to `count` jobs, each from the lane the priorities and
    -- the tombstones say (emq_priority_goes_first, emq_entry_live), every row checked before
    -- anything is written: the claim takes all of them or none
    local lanes = emq.lanes(base, pending)
    lanes:open(true, true, true)
    if lanes.meta_ring then lanes:open_ring() end
    if done then -- free_done_slot (emq_claim.c): COMPLETECLAIM's job frees a slot of its group
        local group = redis.call('HGET', base .. 'job:' .. done, 'group')
        if group then
            local g = lanes:group(group)
            if g.active > 0 then g.active = g.active - 1 end
            if not g.in_ring and g.card > 0 then lanes:ring_enter(g) end
        end
    end
    lanes:promote(now)
    local claim = { base = base, nonce = nonce, jobs = {}, taken = {}, lanes = lanes }
    if done then claim.taken[done] = true end
    for _, g in ipairs(lanes.gl) do table.sort(g.promoted, function(x, y) return x.score < y.score end) end
    local stream, entry = priority_stream(lanes), lanes:entries()
    -- drops: every entry and member dropped (the bound); tombstones: the <pending> entries among them
    local w = { index = 0, next_promoted = 1, drops = 0, tombstones = 0, bound_hit = false, empty = false }

    -- take_ungrouped (emq_claim.c): the next job of the ungrouped lanes, true when one was taken
    local function take_ungrouped()
        local before = #claim.jobs
        while #claim.jobs == before do
            local level = stream.level()
            if level ~= nil and level < 0 then
                if w.drops >= emq.DROP_MAX then
                    w.bound_hit = true
                    break
                end
                if not take_member(claim, stream.take()) then w.drops = w.drops + 1 end
            else
                local live = false
                while not live do
                    if w.drops >= emq.DROP_MAX then
                        w.bound_hit = true
                        break
                    end
                    local id = entry(w.index)
                    if id == nil then break end
                    w.index = w.index + 1
                    live = take_if_live(claim, id)
                    if not live then w.drops, w.tombstones = w.drops + 1, w.tombstones + 1 end
                end
                if w.bound_hit then break end
                if not live then
                    local p = lanes.promoted_tails[w.next_promoted]
                    if p then
                        w.next_promoted = w.next_promoted + 1
                        take(claim, p.id)
                    elseif level ~= nil then
                        if not take_member(claim, stream.take()) then w.drops = w.drops + 1 end
                    else
                        w.empty = true
                        break
                    end
                end
            end
        end
        return #claim.jobs > before
    end

    -- take_grouped (emq_claim.c): the next job of a group's lane (stored members merged by score
    -- with the ones this call promoted into it), true when one was taken
    local function take_grouped(g)
        local before = #claim.jobs
        while #claim.jobs == before do
            if w.drops >= emq.DROP_MAX then
                w.bound_hit = true
                break
            end
            local id, score
            if g.ltype == 'zset' then
                local got
                if g.taken > 0 then
                    got = redis.call('ZRANGE', g.lane, '(' .. emq.int(g.last_score), '+inf', 'BYSCORE', 'LIMIT', 0, 1,
                        'WITHSCORES')
                else
                    got = redis.call('ZRANGE', g.lane, 0, 0, 'WITHSCORES')
                end
                if #got > 0 then id, score = got[1], got[2] end
            end
            local p = g.promoted[g.promoted_next]
            if p and (id == nil or p.score < tonumber(score)) then
                id = p.id
                g.promoted_next = g.promoted_next + 1
            elseif id ~= nil then
                g.taken = g.taken + 1
                g.last_score = tonumber(score)
            else
                break
            end
            g.leave[#g.leave + 1] = { id = id }
            if not take_member(claim, id) then w.drops = w.drops + 1 end
        end
        return #claim.jobs > before
    end

    -- lane_has_more (emq_claim.c): a group's lane holds a job after the ones this call took
    local function lane_has_more(g)
        if g.promoted[g.promoted_next] then return true end
        if g.ltype ~= 'zset' then return false end
        if g.taken > 0 then
            return #redis.call('ZRANGE', g.lane, '(' .. emq.int(g.last_score), '+inf', 'BYSCORE', 'LIMIT', 0, 1) > 0
        end
        return redis.call('ZCARD', g.lane) > 0
    end

    if lanes.ring_len > 0 or #lanes.ring_push > 0 then
        -- rotate (emq_claim.c): each job from the ring's head member, which moves to the tail
        local idle = 0
        while #claim.jobs < count and not w.bound_hit do
            local size = (lanes.ring_len - lanes.ring_pops) + (#lanes.ring_push - lanes.ring_push_from)
            if size == 0 or idle >= size then break end
            local m, stored = nil, lanes.ring_pops < lanes.ring_len
            if stored then
                m = lanes:ring_at(lanes.ring_pops)
                lanes.ring_pops = lanes.ring_pops + 1
            else
                lanes.ring_push_from = lanes.ring_push_from + 1
                m = lanes.ring_push[lanes.ring_push_from].id
            end
            local took = false
            if m == nil then
                took = false
            elseif m == '' then
                if stored then lanes.ring_popped_empty = true end
                if not w.empty then took = take_ungrouped() end
                lanes.ring_push[#lanes.ring_push + 1] = { id = m }
            else
                local g = lanes:group(m)
                -- a group paused or at its cap takes nothing and leaves; one that reaches its cap
                -- here leaves with the job that took its last slot
                local open = emq.group_claimable(true, g.paused, g.active + g.took, g.cap)
                if open then took = take_grouped(g) end
                if took then g.took = g.took + 1 end
                open = open and emq.group_claimable(true, g.paused, g.active + g.took, g.cap)
                -- a group leaves the ring with its lane's last job (or when its lane is found empty)
                if open and ((took and lane_has_more(g)) or (not took and w.bound_hit)) then
                    lanes.ring_push[#lanes.ring_push + 1] = { id = m }
                else
                    g.leaves = true
                end
            end
            idle = took and 0 or idle + 1
        end
    else
        while #claim.jobs < count do
            if not take_ungrouped() then break end
        end
    end
    local index, next_promoted, tombstones, bound_hit = w.index, w.next_promoted, w.tombstones, w.bound_hit
    -- <pending> loses what was read of it, the promoted entries taken included
    lanes.pops = index + next_promoted - 1
    -- never below 0 (a hand-deleted row dropped more than `stale` counted), written only when it changes
    local d = emq.int(tombstones)
    local stale = emq.dec_cmp(lanes.stale, d) > 0 and emq.dec_add(lanes.stale, '-' .. d) or '0'
    if stale ~= lanes.stale then
        lanes.stale = stale
        lanes.stale_changed = true
    end
    local due = -1
    if #claim.jobs == 0 then
        local left, next_due = lanes:due_left(now)
        due = (bound_hit or left) and now + 1 or next_due
    end
    -- each job taken counts in its group (checked now, written at apply: emq_group.c)
    local groups = emq.groups_claimed(base, claim.jobs)
    return { jobs = claim.jobs, lanes = lanes, record = record, due = due, flow = flow, groups = groups }
end

-- The writes: the lanes (the promotion, the entries taken and dropped), then job by job in the
-- module's order (and so of keyspace events); the reply (false: nothing claimed).
function emq.claim_apply(pending, active, prepared, now, deadline)
    prepared.lanes:apply()
    local reply, rec = {}, {}
    for i, j in ipairs(prepared.jobs) do
        redis.call('HINCRBY', j.row, 'attempts', 1)
        redis.call('HSET', j.row, 'tries', j.tries, 'token', j.token, 'state', 'active', 'claimed_at', emq.int(now))
        redis.call('HDEL', j.row, 'closed_by') -- fires "hdel" only when it was there, as the module's
        redis.call('ZADD', active, emq.int(deadline), j.id)
        reply[i] = job_reply(j.row, j.id, j.token, j.tries)
        record_put(rec, j.id)
        record_put(rec, j.token)
    end
    emq.flow_claim_apply(prepared.flow, #reply)
    emq.groups_claimed_apply(prepared.lanes.base, prepared.groups)
    if #reply == 0 then return false end
    if prepared.record then
        -- remembered as long as the lease: a retry after that finds the jobs lapsed anyway
        redis.call('SET', prepared.record, table.concat(rec))
        redis.call('PEXPIREAT', prepared.record, emq.int(deadline))
    end
    return reply
end
