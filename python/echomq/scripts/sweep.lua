#!lua
-- EMQ.SWEEP <active> <pending> <dead> <base> <max-stalled> <limit>      (module/emq_sweep.c)
--
-- Reply: [recovered ids, dead ids, cancelled ids, dead rows expired], the lists in
-- processing order.  First the due members of <base>delayed move to their lanes (as a claim's
-- do).  Takes the members of <active> whose lease lapsed (score <= server-now), oldest first,
-- at most <limit>: each counts a stall and goes back to the head of its lane (in deadline
-- order) or, at <max-stalled> stalls, to <dead> (scored with the time it died, counted in the
-- metric); one whose cancel was requested ends cancelled.  A job that ends is announced on
-- <base>done:<id>.  With a dead retention (<base>meta
-- dead_ttl_ms >= 0), dead jobs that died that long ago leave <dead> with their rows, as many
-- as <limit> leaves room for after the lapsed ones.  Every row and the metric are read and
-- checked before the first write.
--
-- <limit> may not exceed the server's emq.max-limit, which a script cannot read: the
-- client's max_limit (<setting>) stands in for it.
local RECOVERED, DEAD, CANCELLED, EXPIRED = 1, 2, 3, 4

return emq.verb({ 'ZREM', 'DEL', 'HSET', 'HINCRBY', 'ZADD', 'RPUSH', 'LPUSH', 'PEXPIREAT' }, function()
    -- parse
    local argv, argc, max_limit = emq.args()
    if argc ~= 7 then emq.wrong_arity('emq.sweep') end
    local active, pending, dead, base = argv[1], argv[2], argv[3], argv[4]
    emq.check_queue_keys(argv, 1, { 'active', 'pending', 'dead' }, base, emq.E.THREE_SETS)
    local max_stalled = emq.parse_count(argv[5], emq.E.MAX_STALLED)
    local limit = emq.parse_limit(argv[6], emq.max_limit(max_limit))
    emq.check_cluster_base(base)
    local now = emq.now_ms()

    -- open and type-check
    if not emq.type_ok(emq.type(active), 'zset') or not emq.type_ok(emq.type(pending), 'list')
        or not emq.type_ok(emq.type(dead), 'zset') then
        emq.refuse(emq.E.WRONGTYPE)
    end

    -- read: the settings, the due delayed jobs, the lapsed jobs, and the dead past their retention
    local meta = emq.read_meta(base)
    local lanes = emq.lanes(base, pending)
    lanes:promote(now)
    local jobs = {}
    for _, id in ipairs(emq.zset_head(active, emq.int(now), limit)) do
        jobs[#jobs + 1] = { id = id, row = base .. 'job:' .. id, fate = RECOVERED }
    end
    local lapsed = #jobs
    -- the expired dead share <limit> with the lapsed: one call takes at most <limit> jobs
    if limit - lapsed > 0 and meta.dead_ttl >= 0 and now - meta.dead_ttl >= 0 then
        for _, id in ipairs(emq.zset_head(dead, emq.int(now - meta.dead_ttl), limit - lapsed)) do
            jobs[#jobs + 1] = { id = id, row = base .. 'job:' .. id, fate = EXPIRED }
        end
    end

    -- decide: every row's ACL before any row is read (a refusal reveals nothing): a lapsed
    -- job's row is read and changed, an expired dead job's deleted unread; then row by row, as
    -- the module opens them: a row of a slot on the move, its type, its count
    local function access(j)
        return j.fate == EXPIRED and emq.DELETE or emq.READ_WRITE
    end
    for _, j in ipairs(jobs) do
        if not emq.may(j.row, access(j)) then emq.refuse(emq.E.NOPERM_DERIVED) end
    end
    local deaths = 0
    for _, j in ipairs(jobs) do
        local rtype = emq.open_derived(j.row, access(j))
        if not emq.type_ok(rtype, 'hash') then emq.refuse(emq.E.WRONGTYPE) end
        if j.fate == EXPIRED then
            emq.ended_prepare(base, j.id, 'deleted', true)
        else
            emq.left_active_prepare(base, j.id)
            if emq.hexists(j.row, rtype, 'cancel_requested') then
                j.fate = CANCELLED
                emq.ended_prepare(base, j.id, 'cancelled', false)
            else
                -- a row that vanished while its id stayed active is re-created by the stall
                -- count, as HINCRBY would: the id is not silently dropped
                local stalled = emq.incr(emq.hget(j.row, rtype, 'stalled'), '1', emq.E.STALLED_NOT_INTEGER)
                if emq.dec_cmp(stalled, emq.canonical(argv[5])) >= 0 then
                    j.fate = DEAD
                    deaths = deaths + 1
                    emq.ended_prepare(base, j.id, 'dead', false)
                else
                    -- back to the head of its lane, in deadline order
                    lanes:place_row(j.id, j.row, rtype, true)
                end
            end
        end
    end
    local metrics = base .. 'metrics:failed'
    if deaths > 0 then
        local mtype = emq.open_derived(metrics, emq.READ_WRITE)
        if not emq.type_ok(mtype, 'hash') then emq.refuse(emq.E.WRONGTYPE) end
        emq.incr(emq.hget(metrics, mtype, 'count'), emq.int(deaths), emq.E.FAILED_NOT_INTEGER)
    end

    -- apply, job by job, in the order of the seed's Lua (and so of its keyspace events)
    local at = emq.int(now)
    local lists = { {}, {}, {} }
    for _, j in ipairs(jobs) do
        if j.fate == EXPIRED then
            redis.call('ZREM', dead, j.id)
            redis.call('DEL', j.row)
            emq.ended_apply(base, j.id, 'deleted', true)
        else
            redis.call('ZREM', active, j.id)
            emq.left_active_apply(base, j.id)
            if j.fate == CANCELLED then
                redis.call('HSET', j.row, 'state', 'cancelled', 'finished_at', at)
                emq.ended_apply(base, j.id, 'cancelled', false)
                emq.retain(j.row, now, meta.cancelled_ttl)
            else
                redis.call('HINCRBY', j.row, 'stalled', 1)
                if j.fate == DEAD then
                    redis.call('HSET', j.row, 'state', 'dead')
                    redis.call('HSET', j.row, 'last_error', 'stalled', 'finished_at', at)
                    redis.call('ZADD', dead, at, j.id)
                    redis.call('HINCRBY', metrics, 'count', 1)
                    emq.ended_apply(base, j.id, 'dead', false)
                else
                    redis.call('HSET', j.row, 'state', 'pending')
                end
            end
            local list = lists[j.fate]
            list[#list + 1] = j.id
        end
    end
    -- the lanes last: the promotion, and the recovered at their heads
    lanes:apply()
    emq.deps_drain_after(base, math.max(limit, emq.DEPS_STEP)) -- the ends not resolved yet (emq_deps.c)
    return { lists[RECOVERED], lists[DEAD], lists[CANCELLED], #jobs - lapsed }
end)
