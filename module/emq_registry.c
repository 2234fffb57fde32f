/* emq_registry.c -- see emq_registry.h. */
#include "emq_registry.h"

#include <string.h>

#include "emq.h"

void emq_registry_init(EmqRegistry *g, RedisModuleCtx *ctx) {
    memset(g, 0, sizeof *g);
    g->ctx = ctx;
}

RedisModuleString *emq_registry_name(RedisModuleCtx *ctx, RedisModuleString *base) {
    return emq_derived_key(ctx, base, "queue", NULL);
}

int emq_registry_open(EmqRegistry *g, RedisModuleUser *user, RedisModuleString *base, EmqKey *pending) {
    /* A queue whose default lane holds an id had its marker made by the
     * enqueue that found the lane empty: no lookup on the busy path. */
    if (!emq_key_empty(pending)) return EMQ_OK;
    g->name = emq_registry_name(g->ctx, base);
    return emq_open_derived(g->ctx, user, &g->key, g->name, EMQ_DERIVED_RECORD_CREATE);
}

void emq_registry_mark(EmqRegistry *g, EmqFx *fx) {
    if (g->name == NULL || !emq_key_empty(&g->key)) return;
    emq_fx_set(fx, &g->key, emq_small_int[1]);
}

void emq_registry_close(EmqRegistry *g) {
    emq_key_close(&g->key);
    if (g->name) RedisModule_FreeString(g->ctx, g->name);
}
