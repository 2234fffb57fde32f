#!lua flags=allow-oom
-- EMQ.COMPLETE <active> <job> <id> <token> [RESULT <bytes>]             (module/emq_finish.c)
--
-- :1 the job leaves <active>; its row gets state=done, finished_at (and `result`, in pieces,
-- with RESULT), and expires after the queue's done retention; its id is announced on
-- <base>done:<id>.  :-1 gone; -EMQSTALE wrong token or no longer active (nothing written).  A
-- retry of a COMPLETE whose reply was lost (closed_by=complete) answers :1 and writes nothing.
-- Not deny-oom (allow-oom): finishing a job must work under memory pressure (a RESULT past
-- maxmemory is refused).  <setting> is the client's max_result_bytes.
-- include: _complete.lua
return emq.verb({ 'ZREM', 'HSET', 'HDEL', 'DEL', 'PEXPIREAT', 'RPUSH', 'ZADD' }, function()
    -- parse
    local argv, argc, setting = emq.args()
    if argc < 5 then emq.wrong_arity('emq.complete') end
    local active, row, id, token = argv[1], argv[2], argv[3], argv[4]
    emq.complete_check(active, row, id)
    local result = emq.result_option(argv, argc, 5, emq.max_bytes(setting), true)
    local now = emq.now_ms()

    -- open, type-check, read and decide
    local prepared = emq.complete_prepare(active, row, id, token, result)

    -- apply
    emq.complete_apply(active, row, id, prepared, now)
    return prepared.reply
end)
