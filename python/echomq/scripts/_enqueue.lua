-- _enqueue.lua -- what ENQUEUE and ENQUEUEMANY share (module/emq_enqueue.c): the options,
-- the new row, and whether an existing row was made by this very request.

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

-- The new row: one HSET, as the core command would be; the request id only when given.
local function write_row(row, payload, now, req)
    if req then
        redis.call('HSET', row, 'state', 'pending', 'attempts', '0', 'tries', '0', 'payload', payload,
            'enqueued_at', emq.int(now), 'request', req)
    else
        redis.call('HSET', row, 'state', 'pending', 'attempts', '0', 'tries', '0', 'payload', payload,
            'enqueued_at', emq.int(now))
    end
end

-- True when an existing row was created by request `req`.
local function made_by(row, rtype, req)
    return req ~= nil and emq.hget(row, rtype, 'request') == req
end
