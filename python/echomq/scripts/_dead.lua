-- _dead.lua -- what RETRY, RETRYDEAD and PURGE share (module/emq_dead.c).
--
-- A dead job waits in <dead>, scored with the time it died, with its row.  RETRY sends it
-- (or a cancelled job) back to the tail of its lane with a fresh budget; PURGE deletes it.  The
-- fencing token is not touched: `attempts` keeps counting every claim, and the retry
-- deletes `closed_by`, so a holder from before the retry stays stale for good.

-- The retry itself, in the order of the core commands it stands for: ZREM <dead>; HSET state
-- pending tries 0 stalled 0; HINCRBY retries; HDEL cancel_requested, closed_by, finished_at
-- (one "hdel" per field that was there); PERSIST (a cancelled row was expiring).  The job
-- enters its lane's tail with the caller's lanes:apply() (one RPUSH or ZADD for a batch).
local function retry_apply(dead, row, id)
    redis.call('ZREM', dead, id)
    redis.call('HSET', row, 'state', 'pending', 'tries', '0', 'stalled', '0')
    redis.call('HINCRBY', row, 'retries', 1)
    redis.call('HDEL', row, 'cancel_requested')
    redis.call('HDEL', row, 'closed_by')
    redis.call('HDEL', row, 'finished_at')
    redis.call('PERSIST', row)
end

-- [UNTIL <ms>] from argv[first] on: the score bound to pass to ZRANGE ('+inf' without it).
-- The argument itself is the bound: the server rounds it to a double as the module does.
local function parse_until(argv, first, argc)
    local until_score, seen = '+inf', false
    for i = first, argc - 1, 2 do
        if i + 1 >= argc or seen or not emq.option_is(argv[i], 'UNTIL') then emq.refuse(emq.E.SYNTAX) end
        if emq.canonical(argv[i + 1]) == nil then emq.refuse(emq.E.UNTIL) end
        until_score, seen = argv[i + 1], true
    end
    return until_score
end

-- The batch a bulk verb takes: the oldest members of <dead> scored at or before `until`, at
-- most `limit`, with their rows opened for `access` (each row's ACL before it is read:
-- RETRYDEAD changes them, PURGE deletes them).
local function batch_open(dead, base, until_score, limit, access)
    local batch = {}
    for i, id in ipairs(emq.zset_head(dead, until_score, limit)) do
        batch[i] = { id = id, row = base .. 'job:' .. id }
    end
    for _, d in ipairs(batch) do
        d.rtype = emq.open_derived(d.row, access)
        if not emq.type_ok(d.rtype, 'hash') then emq.refuse(emq.E.WRONGTYPE) end
    end
    return batch
end
