#!lua flags=allow-oom
-- include: _dead.lua
-- EMQ.PURGE <dead> <base> <limit> [UNTIL <ms>]                         (module/emq_dead.c)
--
-- Deletes the <limit> oldest members of <dead> (those that died at or before UNTIL when it
-- is given) and their rows.  Reply :<n>, the members removed.  A member whose row is in
-- another state than dead leaves <dead> but its row is kept.  Not deny-oom (allow-oom): it
-- frees memory.
return emq.verb({ 'ZREM', 'DEL' }, function()
    -- parse
    local argv, argc, max_limit = emq.args()
    if argc < 4 then emq.wrong_arity('emq.purge') end
    local limit = emq.parse_limit(argv[3], emq.max_limit(max_limit))
    local until_score = parse_until(argv, 4, argc)
    local dead, base = argv[1], argv[2]
    emq.check_queue(argv, 1, { 'dead' }, base, emq.E.DEAD_KEY)

    -- open and type-check
    if not emq.type_ok(emq.type(dead), 'zset') then emq.refuse(emq.E.WRONGTYPE) end
    local batch = batch_open(dead, base, until_score, limit, emq.READ_DELETE)

    -- read and decide (emq_purge_deletes_row): the row goes with the member when it says
    -- dead (or is already gone)
    for _, d in ipairs(batch) do
        d.act = d.rtype == 'none' or emq.hget(d.row, d.rtype, 'state') == 'dead'
    end
    -- the rows deleted are of jobs that ended: the `ended` hook's deletion steps run
    for _, d in ipairs(batch) do
        if d.act then emq.ended_prepare(base, d.id, 'deleted', true) end
    end

    -- apply: ZREM, then DEL, member by member
    for _, d in ipairs(batch) do
        redis.call('ZREM', dead, d.id)
        if d.act then
            redis.call('DEL', d.row)
            emq.ended_apply(base, d.id, 'deleted', true)
        end
    end
    return #batch
end)
