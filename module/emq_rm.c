/* emq_rm.c -- fill the module API pointers declared in emq_rm.h. */
#include <string.h>

#include "emq_rm.h"

#define EMQ_RM_DEFINE(ret, name, params) ret(*RedisModule_##name) params = NULL;
EMQ_RM_REQUIRED(EMQ_RM_DEFINE)
EMQ_RM_OPTIONAL(EMQ_RM_DEFINE)
#undef EMQ_RM_DEFINE

typedef int (*emq_getapi_fn)(const char *name, void *fnptr);

int emq_rm_init(RedisModuleCtx *ctx, const char *name, int version) {
    /* The server stores its lookup function in the first word of the
     * context it passes to OnLoad; that is how every module finds the API. */
    emq_getapi_fn getapi;
    memcpy(&getapi, (const void *)ctx, sizeof getapi);
    int missing = 0;

#define EMQ_RM_FETCH_REQUIRED(ret, fn, params) \
    if (getapi("RedisModule_" #fn, (void *)&RedisModule_##fn) != REDISMODULE_OK) missing = 1;
#define EMQ_RM_FETCH_OPTIONAL(ret, fn, params) \
    if (getapi("RedisModule_" #fn, (void *)&RedisModule_##fn) != REDISMODULE_OK) RedisModule_##fn = NULL;
    EMQ_RM_REQUIRED(EMQ_RM_FETCH_REQUIRED)
    EMQ_RM_OPTIONAL(EMQ_RM_FETCH_OPTIONAL)
#undef EMQ_RM_FETCH_REQUIRED
#undef EMQ_RM_FETCH_OPTIONAL

    if (missing) return REDISMODULE_ERR;
    if (RedisModule_IsModuleNameBusy && RedisModule_IsModuleNameBusy(name)) return REDISMODULE_ERR;
    RedisModule_SetModuleAttribs(ctx, name, version, REDISMODULE_APIVER_1);
    return REDISMODULE_OK;
}
