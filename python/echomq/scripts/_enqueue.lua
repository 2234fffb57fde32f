-- _enqueue.lua -- what ENQUEUE and ENQUEUEMANY share (module/emq_enqueue.c): the options,
-- the new row, and the request record.

-- [DELAY <ms> | AT <unix-ms>] [PRIORITY <n>] [GROUP <g>] [REQ <request-id>], from argv[from]: the
-- request id (or nil), the due time (now when neither DELAY nor AT), the level (0 without
-- PRIORITY) and the group (or nil); and
-- ENQUEUE's UNIQUE options into `u` (emq.unique_option; nil for ENQUEUEMANY, which refuses UNIQUE).
local function parse_options(argv, from, argc, now, u, d)
    local seen_when, req, due, level, seen_priority, group = nil, nil, now, 0, false, nil
    local i = from
    while i < argc do
        local took = emq.unique_option(u, argv, i, argc)
        if took == 0 then took = emq.deps_option(d, argv, i, argc) end
        if took > 0 then
            i = i + took
        else
            if i + 1 >= argc then emq.refuse(emq.E.SYNTAX) end
            local opt, val = argv[i], argv[i + 1]
            local delay, at = emq.option_is(opt, 'DELAY'), emq.option_is(opt, 'AT')
            if emq.option_is(opt, 'REQ') and not req then
                if #val == 0 then emq.refuse(emq.E.REQ_EMPTY) end
                req = val
            elseif emq.option_is(opt, 'PRIORITY') and not seen_priority then
                seen_priority = true
                level = emq.parse_priority(val)
            elseif emq.option_is(opt, 'GROUP') and not group then
                group = emq.parse_group(val)
            elseif delay or at then
                local which = delay and 'DELAY' or 'AT'
                if seen_when then emq.refuse(seen_when == which and emq.E.SYNTAX or emq.E.DELAY_AND_AT) end
                seen_when = which
                due = delay and emq.due_after_delay(now, val) or emq.due_at(now, val)
            else
                emq.refuse(emq.E.SYNTAX)
            end
            i = i + 2
        end
    end
    if u then emq.unique_options_check(u) end
    return req, due, level, group, seen_when ~= nil
end

-- <setting>: "<max-limit> <max-payload-bytes>" (ENQUEUE has no count: its max-limit is unused).
local function enqueue_setting(setting)
    local limit, payload = (setting or ''):match('^(%S*) ?(.*)$')
    return emq.max_limit(limit), emq.max_bytes(payload)
end

-- The payload's ceiling (emq.max-payload-bytes).
local function check_payload(payload, max_payload)
    if #payload > max_payload then emq.refuse(emq.E.PAYLOAD_TOO_LARGE) end
end

-- The new row: one HSET, as the core command would be: state, the payload and its pieces,
-- enqueued_at, the level when it is not 0, the group and the UNIQUE key when given.  No counters:
-- absent is 0 claims.
local function write_row(row, payload, now, level, group, unique, state, extra)
    local fields = { 'state', state or 'pending' }
    emq.pieces(fields, 'payload', payload)
    fields[#fields + 1] = 'enqueued_at'
    fields[#fields + 1] = emq.int(now)
    if level ~= 0 then
        fields[#fields + 1] = 'priority'
        fields[#fields + 1] = emq.int(level)
    end
    if group then
        fields[#fields + 1] = 'group'
        fields[#fields + 1] = group
    end
    if unique then
        fields[#fields + 1] = 'unique'
        fields[#fields + 1] = unique
    end
    for _, x in ipairs(extra or {}) do fields[#fields + 1] = x end
    redis.call('HSET', row, unpack(fields))
end

-- The request record, <base>req:<request-id> (nil without REQ), opened as the module opens it:
-- created only, as SET NX would (write permission; nothing is read from it).  Returns its
-- name and whether it exists: then this call is a retry of the one that made it, which ran.
local function open_record(base, req)
    if req == nil then return nil, false end
    local record = base .. 'req:' .. req
    return record, emq.open_derived(record, emq.RECORD_CREATE) ~= 'none'
end

-- The queue registry (module/emq_registry.h): <base>queue, the string "1", created when absent as
-- SET NX would (write permission; only its existence is read), looked up only when <pending> is
-- empty: the enqueue that made the default lane non-empty saw to it.
local function open_registry(base, pending)
    if redis.call('EXISTS', pending) == 1 then return nil, true end
    local name = base .. 'queue'
    return name, emq.open_derived(name, emq.RECORD_CREATE) ~= 'none'
end

local function mark_registry(name, exists)
    if name and not exists then redis.call('SET', name, '1') end
end

-- Remember the call for 60 s (emq_core.h: EMQ_ENQUEUE_RECORD_TTL_MS): its count, expiring at an
-- absolute time, as a replica and the AOF get it.
local ENQUEUE_RECORD_TTL_MS = 60000
local function write_record(record, count, now)
    redis.call('SET', record, emq.int(count))
    redis.call('PEXPIREAT', record, emq.int(now + ENQUEUE_RECORD_TTL_MS))
end
