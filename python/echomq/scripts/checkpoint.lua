#!lua flags=allow-oom
-- include: _lease.lua
-- EMQ.CHECKPOINT <active> <job> <id> <token> <lease-ms> [STATE <bytes>]   (module/emq_lease.c)
--
-- EXTEND for holders that want remote cancels delivered: [1, reason] (the stored cancel
-- request, or null) instead of :1.  With STATE, the bytes are stored on the row in the same
-- step (checkpoint, checkpoint_at, checkpoint_attempt), fenced like the lease.  Past
-- maxmemory a checkpoint WITH state is refused (-OOM, nothing written); one without state
-- still extends the lease.  The state's size cap is the client's max_state_bytes (<setting>),
-- which the client keeps equal to the server's emq.max-state-bytes.
return emq.verb({ 'ZADD', 'HGET', 'HSET' }, function() return extend_lease(true, 'emq.checkpoint') end)
