/* emq_lifecycle.h -- EMQ.ENQUEUE, EMQ.CLAIM, EMQ.COMPLETE, EMQ.FAIL. */
#ifndef EMQ_LIFECYCLE_H
#define EMQ_LIFECYCLE_H

#include "emq_rm.h"

/* Register the lifecycle commands; called from RedisModule_OnLoad. */
int emq_register_lifecycle(RedisModuleCtx *ctx);

#endif
