#!lua flags=allow-oom
-- include: _lease.lua
-- EMQ.EXTEND <active> <job> <id> <token> <lease-ms>                   (module/emq_lease.c)
--
-- :1 the lease now ends at server-now + lease-ms; :-1 the row is gone; -EMQSTALE the token
-- is not the row's, or <id> is no longer active.  Not deny-oom (allow-oom): live handlers
-- keep their leases under memory pressure.
return emq.verb({ 'ZADD' }, function() return extend_lease(false, 'emq.extend') end)
