-- _pause.lua -- PAUSE and RESUME (module/emq_admin.c, pause_or_resume), shared by pause.lua
-- and resume.lua.
--
-- PAUSE sets <base>meta `paused` (HSET paused 1): CLAIM hands out nothing until RESUME
-- deletes it (HDEL).  Reply :1 when the call changed the setting, :0 when the queue was
-- already paused (or running): nothing written then.
local function pause_or_resume(pause, name)
    -- parse
    local argv, argc = emq.args()
    if argc ~= 3 then emq.wrong_arity(name) end
    local base = argv[2]
    emq.check_queue(argv, 1, { 'pending' }, base, emq.E.PENDING_KEY)

    -- open and type-check
    local meta = base .. 'meta'
    local mtype = emq.open_derived(meta, emq.READ_WRITE)
    if not emq.type_ok(mtype, 'hash') then emq.refuse(emq.E.WRONGTYPE) end

    -- read, decide, apply
    local changed = emq.hexists(meta, mtype, 'paused') ~= pause
    if changed and pause then redis.call('HSET', meta, 'paused', '1') end
    if changed and not pause then redis.call('HDEL', meta, 'paused') end
    return changed and 1 or 0
end
