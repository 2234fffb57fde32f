-- _enqueue.lua -- what ENQUEUE and ENQUEUEMANY share (module/emq_enqueue.c): the options,
-- the new row, and the request record.

-- [DELAY <ms> | AT <unix-ms>] [REQ <request-id>], from argv[from]: the request id (or nil)
-- and the due time (now when neither DELAY nor AT).
local function parse_options(argv, from, argc, now)
    local seen_when, req, due = nil, nil, now
    for i = from, argc - 1, 2 do
        if i + 1 >= argc then emq.refuse(emq.E.SYNTAX) end
        local opt, val = argv[i], argv[i + 1]
        local delay, at = emq.option_is(opt, 'DELAY'), emq.option_is(opt, 'AT')
        if emq.option_is(opt, 'REQ') and not req then
            if #val == 0 then emq.refuse(emq.E.REQ_EMPTY) end
            req = val
        elseif delay or at then
            local which = delay and 'DELAY' or 'AT'
            if seen_when then emq.refuse(seen_when == which and emq.E.SYNTAX or emq.E.DELAY_AND_AT) end
            seen_when = which
            due = delay and emq.due_after_delay(now, val) or emq.due_at(now, val)
        else
            emq.refuse(emq.E.SYNTAX)
        end
    end
    return req, due
end

-- The new row: one HSET, as the core command would be.
local function write_row(row, payload, now)
    redis.call('HSET', row, 'state', 'pending', 'attempts', '0', 'tries', '0', 'payload', payload,
        'enqueued_at', emq.int(now))
end

-- The request record, <base>req:<request-id> (nil without REQ), opened as the module opens it:
-- created only, as SET NX would (write permission; nothing is read from it).  Returns its
-- name and whether it exists: then this call is a retry of the one that made it, which ran.
local function open_record(base, req)
    if req == nil then return nil, false end
    local record = base .. 'req:' .. req
    return record, emq.open_derived(record, emq.RECORD_CREATE) ~= 'none'
end

-- Remember the call for 60 s (emq_core.h: EMQ_ENQUEUE_RECORD_TTL_MS): its count, expiring at an
-- absolute time, as a replica and the AOF get it.
local ENQUEUE_RECORD_TTL_MS = 60000
local function write_record(record, count, now)
    redis.call('SET', record, emq.int(count))
    redis.call('PEXPIREAT', record, emq.int(now + ENQUEUE_RECORD_TTL_MS))
end
