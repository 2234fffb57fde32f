-- _flow.lua -- flow control (module/emq_flow.c, emq_core.c's emq_rate_allowance): the queue's
-- rate limit and back-off in <base>limit, read by every claim and by EMQ.LIMIT.
--
-- <base>limit: `max` and `per_ms` (at most `max` jobs handed out per window of `per_ms`),
-- `window` and `used` (the window the count is for, and the count), `backoff_until` (no
-- claim before this server time).  Windows are fixed and aligned to the server clock:
-- [k * per_ms, (k + 1) * per_ms).
emq.RATE_MAX_MAX, emq.RATE_PER_MAX = 1000000000, 86400000
local MAX_EXACT = 9007199254740992

-- A stored field: absent is 0; else a canonical integer from min to max (LIMIT_FIELD).
local function limit_field(v, min, max)
    if v == false or v == nil then return 0 end
    local n = emq.parse_ll(v)
    if n == nil or emq.dec_cmp(v, emq.int(min)) < 0 or emq.dec_cmp(v, emq.int(max)) > 0 then
        emq.refuse(emq.E.LIMIT_FIELD)
    end
    return n
end

function emq.read_rate(name, ltype)
    local r = { max = 0, per = 0, window = 0, used = 0, ['until'] = 0 }
    if ltype ~= 'hash' then return r end
    local v = redis.call('HMGET', name, 'max', 'per_ms', 'window', 'used', 'backoff_until')
    r.max = limit_field(v[1], 1, emq.RATE_MAX_MAX)
    r.per = limit_field(v[2], 1, emq.RATE_PER_MAX)
    r.window = limit_field(v[3], 0, MAX_EXACT)
    r.used = limit_field(v[4], 0, MAX_EXACT)
    r['until'] = limit_field(v[5], 0, MAX_EXACT)
    if (r.max == 0) ~= (r.per == 0) then emq.refuse(emq.E.LIMIT_FIELD) end
    return r
end

-- emq_rate_window: the start of the window `now` falls in.
function emq.rate_window(now, per)
    return now - now % per
end

-- emq_rate_allowance: -1 (no limit), 0 (refused; reopen = when to look again) or the jobs
-- left in the window; and the window's use before this claim.
function emq.rate_allowance(r, now)
    if r['until'] > now then return 0, 0, r['until'] end
    if r.max == 0 then return -1, 0, -1 end
    local start = emq.rate_window(now, r.per)
    local used = r.window == start and r.used or 0
    if used >= r.max then return 0, used, start + r.per end
    return r.max - used, used, -1
end

-- emq_flow_claim_prepare: { name, rate, start, used }, the allowance and when to look again.
function emq.flow_claim_prepare(base, now)
    local name = base .. 'limit'
    local ltype = emq.open_derived(name, emq.READ_WRITE)
    if not emq.type_ok(ltype, 'hash') then emq.refuse(emq.E.WRONGTYPE) end
    local flow = { name = name, rate = emq.read_rate(name, ltype), start = 0, used = 0 }
    local allowance, used, reopen = emq.rate_allowance(flow.rate, now)
    flow.used = used
    if flow.rate.max > 0 then flow.start = emq.rate_window(now, flow.rate.per) end
    return flow, allowance, reopen
end

-- emq_flow_claim_apply: the claim took n jobs.
function emq.flow_claim_apply(flow, n)
    if flow == nil or flow.rate.max == 0 or n <= 0 then return end
    redis.call('HSET', flow.name, 'window', emq.int(flow.start), 'used', emq.int(flow.used + n))
end

-- emq_flow_backoff_prepare: RELEASE ... BACKOFF <ms>: the back-off's end, written only when
-- later than the one stored.
function emq.flow_backoff_prepare(base, now, ms)
    local name = base .. 'limit'
    local ltype = emq.open_derived(name, emq.READ_WRITE)
    if not emq.type_ok(ltype, 'hash') then emq.refuse(emq.E.WRONGTYPE) end
    local r = emq.read_rate(name, ltype)
    return { name = name, set_until = (now + ms > r['until']) and now + ms or 0 }
end

function emq.flow_backoff_apply(flow)
    if flow == nil or flow.set_until == 0 then return end
    redis.call('HSET', flow.name, 'backoff_until', emq.int(flow.set_until))
end
