/* emq_rm.c -- fill the module API pointers declared in emq_rm.h. */
#include <string.h>

#include "emq_rm.h"

#define EMQ_RM_DEFINE(ret, name, params) ret(*RedisModule_##name) params = NULL;
EMQ_RM_REQUIRED(EMQ_RM_DEFINE)
EMQ_RM_OPTIONAL(EMQ_RM_DEFINE)
#undef EMQ_RM_DEFINE

typedef int (*emq_getapi_fn)(const char *name, void *fnptr);

/* Every optional function's name counts once, plus the terminating NULL. */
#define EMQ_RM_COUNT(ret, name, params) +1
static const char *missing_optional[0 EMQ_RM_OPTIONAL(EMQ_RM_COUNT) + 1];
#undef EMQ_RM_COUNT

const char *const *emq_rm_missing_optional(void) {
    return missing_optional;
}

int emq_rm_init(RedisModuleCtx *ctx, const char *name, int version) {
    /* The server stores its lookup function in the first word of the
     * context it passes to OnLoad; that is how every module finds the API. */
    emq_getapi_fn getapi;
    memcpy(&getapi, (const void *)ctx, sizeof getapi);
    int missing = 0;
    size_t absent = 0;

#define EMQ_RM_FETCH_REQUIRED(ret, fn, params) \
    if (getapi("RedisModule_" #fn, (void *)&RedisModule_##fn) != REDISMODULE_OK) missing = 1;
#define EMQ_RM_FETCH_OPTIONAL(ret, fn, params)                                      \
    if (getapi("RedisModule_" #fn, (void *)&RedisModule_##fn) != REDISMODULE_OK) { \
        RedisModule_##fn = NULL;                                                    \
        missing_optional[absent++] = #fn;                                           \
    }
    EMQ_RM_REQUIRED(EMQ_RM_FETCH_REQUIRED)
    EMQ_RM_OPTIONAL(EMQ_RM_FETCH_OPTIONAL)
#undef EMQ_RM_FETCH_REQUIRED
#undef EMQ_RM_FETCH_OPTIONAL

    missing_optional[absent] = NULL;
    if (missing) return REDISMODULE_ERR;
    if (RedisModule_IsModuleNameBusy && RedisModule_IsModuleNameBusy(name)) return REDISMODULE_ERR;
    RedisModule_SetModuleAttribs(ctx, name, version, REDISMODULE_APIVER_1);
    return REDISMODULE_OK;
}
