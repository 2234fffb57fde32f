#!lua flags=allow-oom
-- include: _pause.lua
-- EMQ.RESUME <pending> <base>                                          (module/emq_admin.c)
--
-- Claims hand out jobs again.  Not deny-oom (allow-oom), as PAUSE.
return emq.verb({ 'HDEL' }, function() return pause_or_resume(false, 'emq.resume') end)
