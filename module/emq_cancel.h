/* emq_cancel.h -- EMQ.CANCEL and EMQ.CHECKPOINT. */
#ifndef EMQ_CANCEL_H
#define EMQ_CANCEL_H

#include "emq_rm.h"

/* Register the remote-cancel commands; called from RedisModule_OnLoad. */
int emq_register_cancel(RedisModuleCtx *ctx);

#endif
