-- ---------------------------------------------------------------------------
-- The two hooks (emq_end.c): a job leaves <active>; a job ends.  Each a prepare (reads and
-- checks: may refuse) and an apply (writes).  Adding a step: beside the ones below.
-- ---------------------------------------------------------------------------
function emq.left_active_prepare(base, id) end

function emq.left_active_apply(base, id) end

-- Step (emq_unique.c: emq_unique_end_prepare): a unique key the job holds is released -- an UNTIL
-- key at any end, a FOR window only when the row goes.  The row is the caller's, checked by it.
function emq.ended_prepare(base, id, how, already)
    local row = base .. 'job:' .. id
    local key = emq.hget(row, emq.type(row), 'unique')
    if key == nil then return end
    local name = base .. 'unique:' .. key
    if emq.open_derived(name, 'rds') ~= 'string' or redis.call('GET', name) ~= id then return end
    if how ~= 'deleted' and redis.call('PTTL', name) >= 0 then return end
    unique_release[id] = name
end

-- Step: the announcement on <base>done:<id> (SPUBLISH: the scripts need Redis 7.0, which has it).
-- The module publishes whatever the caller's channel permissions; a script publishes as the
-- caller, so a caller who may not publish there ends the job unannounced.
function emq.ended_apply(base, id, how, already)
    local name = unique_release[id]
    if name then
        unique_release[id] = nil
        if redis.call('EXISTS', name) == 1 then redis.call('DEL', name) end
    end
    if already then return end
    local channel = base .. 'done:' .. id
    if redis.acl_check_cmd('SPUBLISH', channel, id) then redis.call('SPUBLISH', channel, id) end
end

-- ---------------------------------------------------------------------------
-- Unique jobs (emq_unique.c): ENQUEUE ... UNIQUE <key> [FOR <ms> | UNTIL done] [REPLACE].
-- ---------------------------------------------------------------------------
emq.UNIQUE_TAKE, emq.UNIQUE_HELD, emq.UNIQUE_REPLACE = 0, 1, 2
local UNIQUE_KEY_MAX, UNIQUE_FOR_MAX = 512, 2592000000

-- emq_unique_option: the option at argv[i] if it is UNIQUE, FOR, UNTIL or REPLACE, into `u`: how
-- many arguments it takes (2, or 1 for REPLACE); 0 when it is none of them.  `u` nil
-- (ENQUEUEMANY): UNIQUE is refused, the others are not its options.
function emq.unique_option(u, argv, i, argc)
    local opt = argv[i]
    local unique, replace = emq.option_is(opt, 'UNIQUE'), emq.option_is(opt, 'REPLACE')
    local for_, until_ = emq.option_is(opt, 'FOR'), emq.option_is(opt, 'UNTIL')
    if u == nil then
        if unique then emq.refuse(E.UNIQUE_MANY) end
        return 0
    end
    if replace then
        if u.replace then emq.refuse(E.SYNTAX) end
        u.replace = true
        return 1
    end
    if not unique and not for_ and not until_ then return 0 end
    if i + 1 >= argc then emq.refuse(E.SYNTAX) end
    local val = argv[i + 1]
    if unique then
        if u.key then emq.refuse(E.SYNTAX) end
        if #val == 0 or #val > UNIQUE_KEY_MAX then emq.refuse(E.UNIQUE_KEY) end
        u.key = val
    else
        local again, other
        if for_ then again, other = u.for_ms ~= nil, u.until_done else again, other = u.until_done, u.for_ms ~= nil end
        if again then emq.refuse(E.SYNTAX) end
        if other then emq.refuse(E.UNIQUE_FOR_AND_UNTIL) end
        if for_ then
            local ms = emq.parse_ll(val)
            if ms == nil or ms < 1 or ms > UNIQUE_FOR_MAX then emq.refuse(E.UNIQUE_FOR) end
            u.for_ms = ms
        else
            if not emq.option_is(val, 'DONE') then emq.refuse(E.UNIQUE_UNTIL) end
            u.until_done = true
        end
    end
    return 2
end

-- emq_unique_options_check: FOR, UNTIL and REPLACE need UNIQUE.
function emq.unique_options_check(u)
    if u.key == nil and (u.replace or u.for_ms or u.until_done) then emq.refuse(E.UNIQUE_NEEDED) end
end

-- emq_unique_decide: free or an orphan's (TAKE), held (HELD), or held by a pending job with
-- REPLACE given (REPLACE); and the holder.  Without UNIQUE: TAKE.
function emq.unique_decide(base, u)
    if u.key == nil then return emq.UNIQUE_TAKE end
    local name = base .. 'unique:' .. u.key
    local t = emq.open_derived(name, emq.RECORD)
    if not emq.type_ok(t, 'string') then emq.refuse(E.WRONGTYPE) end
    if t == 'none' then return emq.UNIQUE_TAKE end
    local holder = redis.call('GET', name)
    local window = redis.call('PTTL', name) >= 0
    local row = base .. 'job:' .. holder
    local rtype = emq.open_derived(row, u.replace and emq.READ_WRITE or emq.READ)
    local state = emq.hget(row, rtype, 'state')
    if not window and state ~= 'pending' and state ~= 'active' then return emq.UNIQUE_TAKE end -- an orphan
    if u.replace and state == 'pending' then return emq.UNIQUE_REPLACE, holder end
    return emq.UNIQUE_HELD, holder
end

-- emq_unique_take: the key names `id` (SET, and PEXPIREAT now + FOR).
function emq.unique_take(base, u, id, now)
    if u.key == nil then return end
    local name = base .. 'unique:' .. u.key
    redis.call('SET', name, id)
    if u.for_ms then redis.call('PEXPIREAT', name, int(now + u.for_ms)) end
end

-- emq_unique_replace: the pending holder's payload becomes `payload` (its old pieces dropped).
function emq.unique_replace(base, holder, payload)
    local row = base .. 'job:' .. holder
    local fields = {}
    local n = emq.pieces(fields, 'payload', payload)
    emq.drop_pieces(row, 'hash', 'payload', n)
    redis.call('HSET', row, unpack(fields))
end

return emq
