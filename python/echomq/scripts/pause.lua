#!lua flags=allow-oom
-- include: _pause.lua
-- EMQ.PAUSE <pending> <base>                                           (module/emq_admin.c)
--
-- Claims get nothing until EMQ.RESUME; everything else goes on.  Not deny-oom (allow-oom):
-- pausing must work in an incident, memory pressure included.
return emq.verb({ 'HSET' }, function() return pause_or_resume(true, 'emq.pause') end)
