#!lua
-- EMQ.COMPLETECLAIM <active> <job> <pending> <id> <token> <lease-ms> [COUNT <n>] [REQ <rid>]
--                   [RESULT <bytes>]                                   (module/emq_claim.c)
--
-- EMQ.COMPLETE, then EMQ.CLAIM (<base> from <active>), in one call: a worker finishes a job
-- and takes the next in one round trip.  Everything both check comes first: an error
-- answers as its verb would, and then nothing was written.  Reply: [COMPLETE's reply,
-- CLAIM's reply (jobs, or null)].  No BLOCK.  The claim's tokens as claim.lua makes them.
-- <setting> is "<nonce> <max-limit> <max-result-bytes>".
-- include: _complete.lua
-- include: _flow.lua
-- include: _claim.lua
return emq.verb({ 'ZREM', 'RPUSH', 'LPOP', 'HINCRBY', 'HSET', 'HDEL', 'ZADD', 'HMGET', 'SET', 'DEL', 'PEXPIREAT' },
    function()
    -- parse
    local argv, argc, setting = emq.args()
    local nonce, max_limit, max_result = emq.claim_setting(setting)
    if argc < 7 then emq.wrong_arity('emq.completeclaim') end
    local active, row, pending, id, token = argv[1], argv[2], argv[3], argv[4], argv[5]
    emq.complete_check(active, row, id)
    local now = emq.now_ms()
    local count, req, result = emq.claim_options(argv, argc, 7, false, now, max_limit, max_result)
    local base = active:sub(1, #active - #'active')
    emq.check_queue({ pending, active }, 1, { 'pending', 'active' }, base, emq.E.PENDING_ACTIVE_KEYS)
    local deadline = emq.lease_deadline(now, argv[6])
    emq.deps_drain(base, emq.DEPS_STEP) -- a step of the ends not resolved yet (emq_deps.c)

    -- open, type-check, read and decide: the complete's, then the claim's
    local done = emq.complete_prepare(active, row, id, token, result)
    local claimed = emq.claim_prepare(pending, active, base, count, req, now, nonce, done.write and id or nil)

    -- apply: the complete's "left active" hook settles its job's group after the claim's
    -- writes, as the claim left the ring (emq_claim.c)
    emq.defer_settle()
    emq.complete_apply(active, row, id, done, now)
    local answer = claimed.answer
    if answer == nil then answer = emq.claim_apply(pending, active, claimed, now, deadline) end
    emq.settle_deferred(base)
    return { done.reply, answer }
    end)
