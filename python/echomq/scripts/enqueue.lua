#!lua
-- include: _enqueue.lua
-- EMQ.ENQUEUE <pending> <base> <id> <payload> [DELAY <ms> | AT <unix-ms>] [PRIORITY <n>] [GROUP <g>]
--             [REQ <request-id>] [UNIQUE <key> [FOR <ms> | UNTIL done] [REPLACE]]
--                                                   (module/emq_enqueue.c, module/emq_unique.c)
--
-- :1 the row <base>job:<id> is created (state=pending, payload and its pieces, enqueued_at,
-- priority unless 0) and <id> waits at the tail of its lane, claimable from server-now -- or
-- in <base>delayed until server-now + DELAY ms, or AT (an AT in the past too, scored with it: claimed oldest due first); with REQ,
-- the record <base>req:<request-id> = "1" is kept for 60 s.  -EMQEXISTS when the row exists.
-- A retry whose first reply was lost (the record exists) answers :1 again and writes nothing,
-- whatever became of the job since.  <setting>: the client's max_payload_bytes.  With UNIQUE
-- the reply is [1, id] (created, or a retry of the call that created it), [0, holder] (the key
-- is held: nothing written) or [2, holder] (REPLACE: the pending holder's payload replaced).
return emq.verb({ 'HSET', 'RPUSH', 'ZADD', 'SET', 'PEXPIREAT' }, function()
    -- parse
    local argv, argc, setting = emq.args()
    if argc < 5 then emq.wrong_arity('emq.enqueue') end
    local _, max_payload = enqueue_setting(setting)
    local pending, base, id, payload = argv[1], argv[2], argv[3], argv[4]
    local now = emq.now_ms()
    local u, d = {}, emq.deps_opts()
    local req, due, level, group, delayed = parse_options(argv, 5, argc, now, u, d)
    emq.deps_options_check(d, id)
    check_payload(payload, max_payload)
    emq.check_queue(argv, 1, { 'pending' }, base, emq.E.PENDING_KEY)
    emq.deps_drain_after(base, emq.DEPS_STEP) -- every enqueue takes a step of the ends not resolved yet

    -- open and type-check: the row's and the record's ACL before they are read
    if not emq.type_ok(emq.type(pending), 'list') then emq.refuse(emq.E.WRONGTYPE) end
    local row = base .. 'job:' .. id
    local rtype = emq.open_derived(row, emq.CREATE)
    local record, retry = open_record(base, req)
    local registry, registered = open_registry(base, pending)

    -- read and decide: a retry of this very call, a unique key held by another job (nothing
    -- enqueued; with REPLACE, a pending holder's payload replaced), a taken id, or a new job --
    -- and where it waits
    if retry then return u.key and { 1, id } or 1 end
    local verdict, holder = emq.unique_decide(base, u)
    if verdict == emq.UNIQUE_REPLACE then emq.unique_replace(base, holder, payload) end
    if verdict ~= emq.UNIQUE_TAKE then return { verdict == emq.UNIQUE_HELD and 0 or 2, holder } end
    if rtype ~= 'none' then emq.refuse(emq.E.EXISTS) end
    -- its dependencies: all met, waited for (no lane yet), or one failed under `fail` (dead at once)
    local v = emq.deps_decide(base, d, id)
    local lanes = emq.lanes(base, pending)
    if v.verdict == 'none' or v.verdict == 'met' then lanes:enter_in(id, group, level, due, now) end

    -- apply
    local extra = {}
    local state = emq.deps_row_fields(d, v, extra, now, due, delayed)
    write_row(row, payload, now, level, group, v.verdict ~= 'dies' and u.key or nil, state, extra)
    lanes:apply()
    emq.deps_apply(base, d, v, id, now)
    if v.verdict ~= 'dies' then emq.unique_take(base, u, id, now) end
    mark_registry(registry, registered)
    if record then write_record(record, 1, now) end
    return u.key and { 1, id } or 1
end)
