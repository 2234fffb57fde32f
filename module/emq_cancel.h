/* emq_cancel.h -- EMQ.CANCEL (its delivery, EMQ.CHECKPOINT, is in emq.c). */
#ifndef EMQ_CANCEL_H
#define EMQ_CANCEL_H

#include "emq_rm.h"

/* Register EMQ.CANCEL; called from RedisModule_OnLoad. */
int emq_register_cancel(RedisModuleCtx *ctx);

#endif
