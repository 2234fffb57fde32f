-- _lease.lua -- a holder keeps its lease: EXTEND and CHECKPOINT (module/emq_lease.c),
-- shared by extend.lua and checkpoint.lua as extend_lease() is in C.
--
-- The lease IS the active set's score, so extending it is one ZADD XX of the deadline,
-- guarded by the fence (the row's token and the id's membership in <active>).

-- EMQ.EXTEND <active> <job> <id> <token> <lease-ms>
-- EMQ.CHECKPOINT <active> <job> <id> <token> <lease-ms> [STATE <bytes>] [PROGRESS <bytes>]
local function extend_lease(with_cancel, name)
    -- parse
    local argv, argc, max_state_bytes = emq.args()
    if (with_cancel and argc < 6) or (not with_cancel and argc ~= 6) then emq.wrong_arity(name) end
    local state, progress = nil, nil
    for i = 6, argc - 1, 2 do
        if i + 1 < argc and not state and emq.option_is(argv[i], 'STATE') then
            state = argv[i + 1]
        elseif i + 1 < argc and not progress and emq.option_is(argv[i], 'PROGRESS') then
            progress = argv[i + 1]
        else
            emq.refuse(emq.E.SYNTAX)
        end
    end
    local active, row, id, token = argv[1], argv[2], argv[3], argv[4]
    if active == row then emq.refuse(emq.E.SAME_KEY) end
    -- the fence checks the token of <job>'s row: it must be <id>'s own row
    if not emq.job_key_matches(active, row, id) then emq.refuse(emq.E.JOB_KEY) end
    local now = emq.now_ms()
    local deadline = emq.lease_deadline(now, argv[5])
    -- the server's emq.max-state-bytes, as the client was told it (a script cannot read it)
    local max_state = emq.max_state_bytes(max_state_bytes)
    if state and #state > max_state then emq.refuse(emq.E.STATE_TOO_LARGE) end
    if progress and #progress > max_state then emq.refuse(emq.E.PROGRESS_TOO_LARGE) end
    if (state or progress) and emq.past_maxmemory() then emq.refuse(emq.E.OOM) end

    -- open and type-check
    local rtype = emq.type(row)
    if not emq.type_ok(emq.type(active), 'zset') or not emq.type_ok(rtype, 'hash') then
        emq.refuse(emq.E.WRONGTYPE)
    end

    -- read and decide: the token first, then membership (the module's ZADD XX answers NOP
    -- for a member that is not there: a swept job is never re-added)
    local current = emq.hget(row, rtype, 'token')
    if current == nil then return -1 end
    if current ~= token then emq.refuse(emq.E.STALE_EXTEND) end
    if not redis.call('ZSCORE', active, id) then emq.refuse(emq.E.NOT_ACTIVE) end

    -- apply: a deadline equal to the current score changes nothing (no event, no effect)
    redis.call('ZADD', active, 'XX', emq.int(deadline), id)
    -- one HSET of the state's fields and the progress, as the module's
    local fields = {}
    if state then
        local attempts = redis.call('HGET', row, 'attempts') or '0'
        fields = { 'checkpoint', state, 'checkpoint_at', emq.int(now), 'checkpoint_attempt', attempts }
    end
    if progress then
        fields[#fields + 1] = 'progress'
        fields[#fields + 1] = progress
    end
    if #fields > 0 then redis.call('HSET', row, unpack(fields)) end

    -- reply
    if not with_cancel then return 1 end
    return { 1, redis.call('HGET', row, 'cancel_requested') }
end
