-- ---------------------------------------------------------------------------
-- Dependencies (emq_deps.c): ENQUEUE ... [ON_PARENT_FAILURE fail|ignore|continue] [MISSING done]
-- AFTER <id> [<id> ...].  A job waiting for its dependencies is `waiting`, in no lane; beside it
-- <base>deps:<id> (each dependency -> `waiting` or how it ended), <base>waiters:<dep> (the jobs
-- waiting on <dep>, scored with their enqueue time) and <base>resolve (the ends not resolved
-- yet, `<how>:<id>`), drained at most emq.DEPS_STEP waiters per command.
-- ---------------------------------------------------------------------------
local E = emq.E
local DEPS_MAX = 1000
emq.DEPS_STEP = 100

-- A call's state, made anew by every call (emq.run).
function emq.deps_reset()
    emq._deps = { items = {}, pushed = nil, request = nil, draining = false }
end

-- emq_deps_option: the option at argv[i] if it is ON_PARENT_FAILURE, MISSING or AFTER, into `d`:
-- how many arguments it takes (AFTER takes the rest); 0 when none.  `d` nil (ENQUEUEMANY): refused.
function emq.deps_option(d, argv, i, argc)
    local opt = argv[i]
    local after, policy = emq.option_is(opt, 'AFTER'), emq.option_is(opt, 'ON_PARENT_FAILURE')
    local missing = emq.option_is(opt, 'MISSING')
    if not after and not policy and not missing then return 0 end
    if d == nil then emq.refuse(E.AFTER_MANY) end
    if after then
        local n = argc - i - 1
        if n < 1 or d.seen_after then emq.refuse(E.SYNTAX) end
        if n > DEPS_MAX then emq.refuse(E.AFTER_TOO_MANY) end
        d.seen_after = true
        local seen = {}
        for k = i + 1, argc - 1 do
            local id = argv[k]
            if #id == 0 then emq.refuse(E.AFTER_EMPTY_ID) end
            if not seen[id] then
                seen[id] = true
                d.ids[#d.ids + 1] = id
            end
        end
        return argc - i
    end
    if i + 1 >= argc then emq.refuse(E.SYNTAX) end
    local v = argv[i + 1]
    if policy then
        if d.seen_policy then emq.refuse(E.SYNTAX) end
        if emq.option_is(v, 'FAIL') then
            d.policy = 'fail'
        elseif emq.option_is(v, 'IGNORE') then
            d.policy = 'ignore'
        elseif emq.option_is(v, 'CONTINUE') then
            d.policy = 'continue'
        else
            emq.refuse(E.AFTER_POLICY)
        end
        d.seen_policy = true
    else
        if d.seen_missing then emq.refuse(E.SYNTAX) end
        if not emq.option_is(v, 'DONE') then emq.refuse(E.AFTER_MISSING) end
        d.missing_done = true
        d.seen_missing = true
    end
    return 2
end

function emq.deps_opts()
    return { ids = {}, policy = 'fail' }
end

-- emq_deps_options_check: ON_PARENT_FAILURE and MISSING need AFTER; a job is none of its own.
function emq.deps_options_check(d, id)
    if not d.seen_after and (d.seen_policy or d.seen_missing) then emq.refuse(E.AFTER_NEEDED) end
    for _, dep in ipairs(d.ids) do
        if dep == id then emq.refuse(E.AFTER_SELF) end
    end
end

local function failed_how(how)
    return how ~= 'done' and how ~= 'missing'
end

-- emq_deps_decide: 'none', 'met', 'wait' or 'dies' (a dependency failed under `fail`), with each
-- dependency's outcome (nil: live) and the live count.
function emq.deps_decide(base, d, id)
    local v = { verdict = 'none', outcome = {}, live = 0 }
    if not d.seen_after then return v end
    -- <base>meta's `deps`: the queue has had a dependency, so its ends look for them
    local mt = emq.open_derived(base .. 'meta', emq.READ_WRITE)
    if not emq.type_ok(mt, 'hash') then emq.refuse(E.WRONGTYPE) end
    v.verdict = 'met'
    for k, dep in ipairs(d.ids) do
        local row = base .. 'job:' .. dep
        local rtype = emq.open_derived(row, emq.READ_WRITE)
        local state = emq.hget(row, rtype, 'state')
        if state == nil then
            -- an error line cannot carry a control byte: each is shown as '?' (as the module does)
            if not d.missing_done then emq.refuse('ERR dependency ' .. dep:gsub('[%z\1-\31\127]', '?') .. ' does not exist') end
            v.outcome[k] = 'missing'
        elseif state == 'done' then
            v.outcome[k] = 'done'
        elseif state == 'dead' or state == 'cancelled' then
            v.outcome[k] = state
            if d.policy == 'fail' and v.verdict ~= 'dies' then
                v.verdict = 'dies'
                v.reason = 'dependency ' .. dep .. ' ' .. state
            end
        else
            v.live = v.live + 1
            local t = emq.open_derived(base .. 'waiters:' .. dep, emq.LANE)
            if not emq.type_ok(t, 'zset') then emq.refuse(E.WRONGTYPE) end
        end
    end
    if v.verdict == 'dies' then
        local t = emq.open_derived(base .. 'dead', emq.LANE)
        if not emq.type_ok(t, 'zset') then emq.refuse(E.WRONGTYPE) end
        return v
    end
    if v.live > 0 then v.verdict = 'wait' end
    local t = emq.open_derived(base .. 'deps:' .. id, emq.READ_WRITE)
    if not emq.type_ok(t, 'hash') then emq.refuse(E.WRONGTYPE) end
    return v
end

-- emq_deps_row_fields: the new row's state and the fields beyond ENQUEUE's, appended to `fields`.
function emq.deps_row_fields(d, v, fields, now, due, delayed)
    if v.verdict == 'none' then return 'pending' end
    local function add(f, x)
        fields[#fields + 1] = f
        fields[#fields + 1] = x
    end
    add('after', emq.int(#d.ids))
    if v.verdict == 'dies' then
        add('finished_at', emq.int(now))
        add('last_error', v.reason)
        return 'dead'
    end
    if v.verdict ~= 'wait' then return 'pending' end
    add('waits', emq.int(v.live))
    if delayed then add('due', emq.int(due)) end
    if d.policy ~= 'fail' then add('on_failure', d.policy) end
    return 'waiting'
end

-- emq_deps_apply: the deps hash and each live dependency's waiter set (its row marked `waiters`),
-- or <base>dead for a job that dies at once.
function emq.deps_apply(base, d, v, id, now)
    if v.verdict == 'none' then return end
    if redis.call('HEXISTS', base .. 'meta', 'deps') == 0 then redis.call('HSET', base .. 'meta', 'deps', '1') end
    if v.verdict == 'dies' then
        redis.call('ZADD', base .. 'dead', emq.int(now), id)
        return
    end
    local fields = {}
    for k, dep in ipairs(d.ids) do
        fields[#fields + 1] = dep
        fields[#fields + 1] = v.outcome[k] or 'waiting'
    end
    redis.call('HSET', base .. 'deps:' .. id, unpack(fields))
    for k, dep in ipairs(d.ids) do
        if not v.outcome[k] then
            redis.call('ZADD', base .. 'waiters:' .. dep, emq.int(now), id)
            local row = base .. 'job:' .. dep
            if redis.call('HEXISTS', row, 'waiters') == 0 then redis.call('HSET', row, 'waiters', '1') end
        end
    end
end

-- -- a job's end (emq_deps_end_prepare / _apply) --------------------------------------------
function emq.deps_end_prepare(base, id, how, already)
    if already then return end
    local row = base .. 'job:' .. id
    local rtype = emq.type(row)
    local has_deps, has_waiters = emq.hexists(row, rtype, 'after'), emq.hexists(row, rtype, 'waiters')
    if not has_deps and not has_waiters then return end
    local it = { leave = {} }
    if has_deps then
        local name = base .. 'deps:' .. id
        local t = emq.open_derived(name, emq.READ_DELETE)
        if not emq.type_ok(t, 'hash') then emq.refuse(E.WRONGTYPE) end
        if t ~= 'none' then
            it.deps = name
            local all = redis.call('HGETALL', name)
            for i = 1, #all - 1, 2 do
                if all[i + 1] == 'waiting' then it.leave[#it.leave + 1] = base .. 'waiters:' .. all[i] end
            end
            for _, w in ipairs(it.leave) do
                if not emq.type_ok(emq.open_derived(w, emq.LANE), 'zset') then emq.refuse(E.WRONGTYPE) end
            end
        end
    end
    if has_waiters then
        it.push = emq.open_derived(base .. 'waiters:' .. id, emq.READ) ~= 'none'
        if it.push then
            local t = emq.open_derived(base .. 'resolve', emq.READ_WRITE)
            if not emq.type_ok(t, 'list') then emq.refuse(E.WRONGTYPE) end
        end
    end
    emq._deps.items[id] = it
end

function emq.deps_end_apply(base, id, how, already)
    if already then return end
    local it = emq._deps.items[id]
    if not it then return end
    emq._deps.items[id] = nil
    for _, w in ipairs(it.leave) do redis.call('ZREM', w, id) end
    if it.deps and redis.call('EXISTS', it.deps) == 1 then redis.call('DEL', it.deps) end
    if it.push then
        redis.call('RPUSH', base .. 'resolve', how .. ':' .. id)
        emq._deps.pushed = base
    end
end

-- -- the resolver (emq_deps_drain) -----------------------------------------------------------
local function field_int(row, rtype, field, fallback)
    local v = emq.hget(row, rtype, field)
    if v == nil then return fallback end
    local n = emq.parse_ll(v)
    if n == nil then emq.refuse(E.AFTER_FIELD) end
    return n
end

-- resolve_one: the waiter `w` learns that `dep` ended `how`: checks first, then writes.
local function resolve_one(base, w, dep, how, now)
    local row, deps, set = base .. 'job:' .. w, base .. 'deps:' .. w, base .. 'waiters:' .. dep
    local rtype = emq.open_derived(row, emq.READ_WRITE)
    if not emq.type_ok(rtype, 'hash') then emq.refuse(E.WRONGTYPE) end
    local dtype = emq.open_derived(deps, emq.READ_WRITE)
    if not emq.type_ok(dtype, 'hash') then emq.refuse(E.WRONGTYPE) end
    if not emq.type_ok(emq.open_derived(set, emq.LANE), 'zset') then emq.refuse(E.WRONGTYPE) end
    if emq.hget(row, rtype, 'state') ~= 'waiting' or emq.hget(deps, dtype, dep) ~= 'waiting' then
        redis.call('ZREM', set, w)
        return
    end
    local waits = field_int(row, rtype, 'waits', 1)
    if waits < 1 or waits > DEPS_MAX then emq.refuse(E.AFTER_FIELD) end
    local policy = emq.hget(row, rtype, 'on_failure')
    if failed_how(how) and policy ~= 'ignore' and policy ~= 'continue' then
        local dead = base .. 'dead'
        if not emq.type_ok(emq.open_derived(dead, emq.LANE), 'zset') then emq.refuse(E.WRONGTYPE) end
        emq.ended_prepare(base, w, 'dead', false)
        redis.call('HSET', row, 'state', 'dead', 'finished_at', emq.int(now),
            'last_error', 'dependency ' .. dep .. ' ' .. how)
        for _, f in ipairs({ 'waits', 'due', 'on_failure' }) do redis.call('HDEL', row, f) end
        redis.call('ZADD', dead, emq.int(now), w)
        emq.ended_apply(base, w, 'dead', false)
        return
    end
    local lanes
    local pending = base .. 'pending'
    if waits == 1 then
        local due = field_int(row, rtype, 'due', now)
        if not emq.type_ok(emq.open_derived(pending, emq.READ_WRITE), 'list') then emq.refuse(E.WRONGTYPE) end
        lanes = emq.lanes(base, pending)
        lanes:enter_row(w, row, rtype, due, now)
    end
    redis.call('HSET', deps, dep, how)
    redis.call('ZREM', set, w)
    if waits > 1 then
        redis.call('HSET', row, 'waits', emq.int(waits - 1))
    else
        redis.call('HSET', row, 'state', 'pending')
        for _, f in ipairs({ 'waits', 'due', 'on_failure' }) do redis.call('HDEL', row, f) end
        lanes:apply()
    end
end

-- Resolve up to `budget` waiters from <base>resolve, as the caller: a key it may not touch stops
-- the drain where it is (each waiter's step is checked before it writes).
function emq.deps_drain(base, budget)
    local s = emq._deps
    if s.draining or budget < 1 then return end
    local rname = base .. 'resolve'
    local t, refused = emq.touch(rname, emq.READ_WRITE)
    if refused or not emq.type_ok(t, 'list') or t == 'none' then return end
    s.draining = true
    local now = emq.now_ms()
    local stop = false
    while budget > 0 and not stop do
        local entry = redis.call('LINDEX', rname, 0)
        if not entry then break end
        local colon = entry:find(':', 1, true)
        if not colon or colon == #entry then
            redis.call('LPOP', rname)
        else
            local how, dep = entry:sub(1, colon - 1), entry:sub(colon + 1)
            local set = base .. 'waiters:' .. dep
            local st, no = emq.touch(set, emq.LANE)
            if no or not emq.type_ok(st, 'zset') then break end
            local ids = redis.call('ZRANGE', set, 0, budget - 1)
            for _, w in ipairs(ids) do
                budget = budget - 1
                local ok, err = pcall(resolve_one, base, w, dep, how, now)
                if not ok then
                    if type(err) == 'table' and err.emq_refusal then
                        stop = true
                        break
                    end
                    error(err, 0)
                end
            end
            if not stop then
                if redis.call('EXISTS', set) == 0 then
                    redis.call('LPOP', rname)
                elseif #ids == 0 then
                    stop = true
                end
            end
        end
    end
    s.draining = false
end

-- A verb asks for a step of the drain after its own work (ENQUEUE, SWEEP).
function emq.deps_drain_after(base, budget)
    emq._deps.request = { base = base, budget = budget }
end

-- After a verb's body (emq.run): the ends it pushed, a step each (the module's emq_end_close),
-- then the step it asked for.
function emq.deps_after()
    local s = emq._deps
    if s.pushed then emq.deps_drain(s.pushed, emq.DEPS_STEP) end
    if s.request then emq.deps_drain(s.request.base, s.request.budget) end
end
