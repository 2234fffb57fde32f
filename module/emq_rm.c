/* emq_rm.c -- fill the module API pointers declared in emq_rm.h. */
#include <string.h>

#include "emq_rm.h"

#define EMQ_RM_DEFINE(ret, name, params) ret(*RedisModule_##name) params = NULL;
EMQ_RM_REQUIRED(EMQ_RM_DEFINE)
EMQ_RM_OPTIONAL(EMQ_RM_DEFINE)
#undef EMQ_RM_DEFINE

typedef int (*emq_getapi_fn)(const char *name, void *fnptr);

/* Every function's name counts once, plus the terminating NULL (and one
 * more required name in a test build, below). */
#define EMQ_RM_COUNT(ret, name, params) +1
static const char *missing_optional[0 EMQ_RM_OPTIONAL(EMQ_RM_COUNT) + 1];
static const char *missing_required[0 EMQ_RM_REQUIRED(EMQ_RM_COUNT) + 2];
#undef EMQ_RM_COUNT

const char *const *emq_rm_missing_optional(void) {
    return missing_optional;
}

int emq_rm_init(RedisModuleCtx *ctx, const char *name, int version) {
    /* The server stores its lookup function in the first word of the
     * context it passes to OnLoad; that is how every module finds the API. */
    emq_getapi_fn getapi;
    memcpy(&getapi, (const void *)ctx, sizeof getapi);
    size_t absent = 0, lacking = 0;

#define EMQ_RM_FETCH_REQUIRED(ret, fn, params)                                      \
    if (getapi("RedisModule_" #fn, (void *)&RedisModule_##fn) != REDISMODULE_OK) { \
        RedisModule_##fn = NULL;                                                    \
        missing_required[lacking++] = #fn;                                          \
    }
#define EMQ_RM_FETCH_OPTIONAL(ret, fn, params)                                      \
    if (getapi("RedisModule_" #fn, (void *)&RedisModule_##fn) != REDISMODULE_OK) { \
        RedisModule_##fn = NULL;                                                    \
        missing_optional[absent++] = #fn;                                           \
    }
    EMQ_RM_REQUIRED(EMQ_RM_FETCH_REQUIRED)
    EMQ_RM_OPTIONAL(EMQ_RM_FETCH_OPTIONAL)
#undef EMQ_RM_FETCH_REQUIRED
#undef EMQ_RM_FETCH_OPTIONAL
#ifdef EMQ_RM_TEST_REQUIRE
    /* Test builds only (module/Makefile: emq-needs-more.so): one more
     * required function, which no server has, so that the refusal below can
     * be seen in a real server's log. */
    void *extra;
    if (getapi("RedisModule_" EMQ_RM_TEST_REQUIRE, &extra) != REDISMODULE_OK)
        missing_required[lacking++] = EMQ_RM_TEST_REQUIRE;
#endif
    missing_optional[absent] = NULL;
    missing_required[lacking] = NULL;

    /* Register the name first, so that even a refusal is logged as "<emq>". */
    if (RedisModule_SetModuleAttribs) RedisModule_SetModuleAttribs(ctx, name, version, REDISMODULE_APIVER_1);
    if (lacking) {
        if (RedisModule_Log)
            for (size_t i = 0; i < lacking; i++)
                RedisModule_Log(ctx, "warning",
                                "not loaded: this server has no RedisModule_%s, which %s needs "
                                "(Redis 6.2 or later, or Valkey, has it)",
                                missing_required[i], name);
        return REDISMODULE_ERR;
    }
    if (RedisModule_IsModuleNameBusy && RedisModule_IsModuleNameBusy(name)) {
        RedisModule_Log(ctx, "warning",
                        "not loaded: a module named '%s' is already loaded (see MODULE LIST); "
                        "MODULE UNLOAD %s first to load this copy instead",
                        name, name);
        return REDISMODULE_ERR;
    }
    return REDISMODULE_OK;
}
