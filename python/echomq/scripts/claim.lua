#!lua
-- EMQ.CLAIM <pending> <active> <base> <lease-ms> [COUNT <n>] [REQ <request-id>] [BLOCK <ms>]
--                                                                      (module/emq_claim.c)
--
-- Reply: an array of up to <n> (default 1, at most 1000 or emq.max-limit) jobs, each [id, token, payload,
-- attempt, state], in priority order (smaller first, first in first out within a level); null
-- when nothing is claimable (the queue is empty, every waiting job is delayed, or the queue is
-- paused).  First the due members of <base>delayed move to their lanes, and tombstones met are
-- dropped (both also when nothing is claimed).  With REQ, a retry of the same request answers
-- the jobs that request claimed and still holds.
--
-- The token is "<attempts>-<16 hex>", as the module makes it.  The module draws 8 random
-- bytes per job; a script cannot: math.random is one fixed sequence, started from the same
-- seed by every server (Redis 7, Valkey 8; older servers even reseeded it before every
-- call), so its "random" parts are predictable, and a replica promoted after a failover
-- would hand out again the very parts the old master did -- with the same counters, for
-- the claims the failover lost.  The client sends 8 fresh random bytes with every call
-- instead (the nonce, <setting>, from os.urandom), and job i of the call gets the first 16
-- hex digits of SHA1(nonce ":" i).  The counter says which claim of the job it is; the
-- random part differs from that of every other claim of the job (each call has its own
-- nonce; the jobs of one call differ by i), also from a claim a failover made the server
-- forget, whose counter repeats; and it cannot be guessed without the nonce.
-- include: _flow.lua
-- include: _claim.lua
return emq.verb({ 'ZREM', 'RPUSH', 'LPOP', 'HINCRBY', 'HSET', 'HDEL', 'ZADD', 'HMGET', 'SET', 'DEL', 'PEXPIREAT' },
    function()
    -- parse
    local argv, argc, setting = emq.args()
    local nonce, max_limit = emq.claim_setting(setting)
    if argc < 5 then emq.wrong_arity('emq.claim') end
    local now = emq.now_ms()
    local count, req = emq.claim_options(argv, argc, 5, true, now, max_limit)
    local pending, active, base = argv[1], argv[2], argv[3]
    emq.check_queue(argv, 1, { 'pending', 'active' }, base, emq.E.PENDING_ACTIVE_KEYS)
    local deadline = emq.lease_deadline(now, argv[4])
    emq.deps_drain(base, emq.DEPS_STEP) -- a step of the ends not resolved yet (emq_deps.c)

    -- open, type-check, read and decide
    local prepared = emq.claim_prepare(pending, active, base, count, req, now, nonce)
    if prepared.answer ~= nil then return prepared.answer end

    -- apply
    return emq.claim_apply(pending, active, prepared, now, deadline)
    end)
