#!lua flags=allow-oom
-- include: _flow.lua
-- EMQ.LIMIT <pending> <base> [RATE <max>] [PER <ms>] [OFF] [BACKOFF <ms>]   (module/emq_flow.c)
--
-- RATE <max> PER <ms> (together) sets the rate: at most <max> jobs claimed per window of <ms>
-- (windows aligned to the server clock).  A new PER (or a first rate) restarts the count in
-- the current window; a new RATE alone keeps it.  OFF removes the rate.  BACKOFF <ms> stops
-- every claim until now + <ms> (never brought forward by a shorter one); BACKOFF 0 lifts it.
-- Reply: [max, per-ms, used, window-ends-at, backoff-until].  Not deny-oom (allow-oom): a
-- worker's back-off and an operator's throttle must work under memory pressure.
local function parse(argv, argc)
    local a = { rate = false, off = false, backoff = false, max = 0, per = 0, backoff_ms = 0 }
    local per = false
    local i = 3
    while i < argc do
        local opt = argv[i]
        if emq.option_is(opt, 'OFF') and not a.off then
            a.off = true
            i = i + 1
        else
            if i + 1 >= argc then emq.refuse(emq.E.SYNTAX) end
            local v = argv[i + 1]
            local n = emq.parse_ll(v)
            if emq.option_is(opt, 'RATE') and not a.rate then
                a.rate = true
                if n == nil or n < 1 or emq.dec_cmp(v, emq.int(emq.RATE_MAX_MAX)) > 0 then
                    emq.refuse(emq.E.RATE_MAX)
                end
                a.max = n
            elseif emq.option_is(opt, 'PER') and not per then
                per = true
                if n == nil or n < 1 or emq.dec_cmp(v, emq.int(emq.RATE_PER_MAX)) > 0 then
                    emq.refuse(emq.E.RATE_PER)
                end
                a.per = n
            elseif emq.option_is(opt, 'BACKOFF') and not a.backoff then
                a.backoff = true
                if n == nil or n < 0 or emq.dec_cmp(v, emq.int(emq.RATE_PER_MAX)) > 0 then
                    emq.refuse(emq.E.BACKOFF)
                end
                a.backoff_ms = n
            else
                emq.refuse(emq.E.SYNTAX)
            end
            i = i + 2
        end
    end
    if a.rate ~= per or (a.off and a.rate) then emq.refuse(emq.E.SYNTAX) end
    return a
end

return emq.verb({ 'HSET', 'HDEL' }, function()
    -- parse
    local argv, argc = emq.args()
    if argc < 3 then emq.wrong_arity('emq.limit') end
    local a = parse(argv, argc)
    local base = argv[2]
    emq.check_queue(argv, 1, { 'pending' }, base, emq.E.PENDING_KEY)
    local now = emq.now_ms()
    local writes = a.rate or a.off or a.backoff

    -- open, type-check and read
    local name = base .. 'limit'
    local ltype = emq.open_derived(name, writes and emq.READ_WRITE or emq.READ)
    if not emq.type_ok(ltype, 'hash') then emq.refuse(emq.E.WRONGTYPE) end
    local r = emq.read_rate(name, ltype)

    -- decide and apply: the rate's fields first, then the back-off
    if a.rate then
        local set = {}
        if a.max ~= r.max then
            set[#set + 1] = 'max'
            set[#set + 1] = emq.int(a.max)
        end
        if a.per ~= r.per then -- a new window length: the count restarts in the current window
            local start = emq.rate_window(now, a.per)
            for _, x in ipairs({ 'per_ms', emq.int(a.per), 'window', emq.int(start), 'used', '0' }) do
                set[#set + 1] = x
            end
            r.window, r.used = start, 0
        end
        if #set > 0 then redis.call('HSET', name, unpack(set)) end
        r.max, r.per = a.max, a.per
    end
    if a.off then
        for _, field in ipairs({ 'max', 'per_ms', 'window', 'used' }) do
            redis.call('HDEL', name, field) -- one HDEL each, as the module fires one event each
        end
        r.max, r.per, r.window, r.used = 0, 0, 0, 0
    end
    if a.backoff and a.backoff_ms == 0 then
        redis.call('HDEL', name, 'backoff_until')
        r['until'] = 0
    elseif a.backoff and now + a.backoff_ms > r['until'] then
        r['until'] = now + a.backoff_ms
        redis.call('HSET', name, 'backoff_until', emq.int(r['until']))
    end

    -- reply
    local used, start = 0, 0
    if r.max > 0 then
        start = emq.rate_window(now, r.per)
        if r.window == start then used = r.used end
    end
    return { r.max, r.per, used, r.max > 0 and start + r.per or 0, r['until'] > now and r['until'] or 0 }
end)
