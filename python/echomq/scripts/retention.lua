#!lua
-- EMQ.RETENTION <pending> <base> [DONE <ms>] [CANCELLED <ms>] [DEAD <ms>]   (module/emq_admin.c)
--
-- Sets (HSET <base>meta) the retention of the queue's finished rows: -1 = keep forever,
-- 0 = delete at once, else ms after the job finished.  Without options it only reads.
-- Reply: the effective [done, cancelled, dead] after the call.  A field the call sets is
-- only written when it changes; one it does not set must be valid where stored.
local OPTIONS = { 'DONE', 'CANCELLED', 'DEAD' }
local FIELDS = { 'done_ttl_ms', 'cancelled_ttl_ms', 'dead_ttl_ms' }

return emq.verb({ 'HSET' }, function()
    -- parse
    local argv, argc = emq.args()
    if argc < 3 then emq.wrong_arity('emq.retention') end
    local given = {}
    local value = { emq.DEFAULT_DONE_TTL_MS, emq.DEFAULT_CANCELLED_TTL_MS, emq.DEFAULT_DEAD_TTL_MS }
    for i = 3, argc - 1, 2 do
        local which = nil
        for w, option in ipairs(OPTIONS) do
            if emq.option_is(argv[i], option) then which = w end
        end
        if which == nil or given[which] or i + 1 >= argc then emq.refuse(emq.E.SYNTAX) end
        value[which] = emq.parse_retention(argv[i + 1], emq.E.RETENTION_VALUE)
        given[which] = argv[i + 1]
    end
    local base = argv[2]
    emq.check_queue(argv, 1, { 'pending' }, base, emq.E.PENDING_KEY)
    local writes = given[1] or given[2] or given[3]

    -- open and type-check
    local meta = base .. 'meta'
    local mtype = emq.open_derived(meta, writes and emq.READ_WRITE or emq.READ)
    if not emq.type_ok(mtype, 'hash') then emq.refuse(emq.E.WRONGTYPE) end

    -- read and decide
    local set = {}
    for w = 1, 3 do
        local cur = emq.hget(meta, mtype, FIELDS[w])
        if given[w] and cur ~= given[w] then
            set[#set + 1] = FIELDS[w]
            set[#set + 1] = given[w]
        elseif not given[w] and cur then
            value[w] = emq.parse_retention(cur, emq.E.META_NOT_INTEGER)
        end
    end

    -- apply: one HSET of the fields that change
    if #set > 0 then redis.call('HSET', meta, unpack(set)) end
    return value
end)
