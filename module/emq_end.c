/* emq_end.c -- see emq_end.h.  One section per step, in each function. */
#include "emq_end.h"

#include "emq.h"

void emq_end_init(EmqEnd *e, RedisModuleCtx *ctx, RedisModuleString *base) {
    e->ctx = ctx;
    e->base = base;
    e->unique = NULL;
    e->deps = NULL;
    emq_groups_init(&e->groups, ctx, base, NULL);
}

void emq_end_close(EmqEnd *e) {
    emq_unique_end_close(e);
    emq_groups_close(&e->groups);
    emq_deps_end_close(e); /* last: it may resolve waiters, with its own effects */
}

int emq_left_active_prepare(EmqEnd *e, RedisModuleString *id, EmqKey *row) {
    return emq_groups_left_prepare(&e->groups, id, row);
}

void emq_left_active_apply(EmqEnd *e, EmqFx *fx, RedisModuleString *id) {
    emq_groups_left_apply(&e->groups, fx, id);
}

int emq_ended_prepare(EmqEnd *e, RedisModuleString *id, int how, int already) {
    return emq_ended_prepare_row(e, id, how, already, NULL, 1);
}

int emq_ended_prepare_row(EmqEnd *e, RedisModuleString *id, int how, int already, EmqKey *open_row, int deps) {
    /* The row is the caller's, checked by it: only the fields the steps
     * look for are read, in one call.  The announcement needs nothing read
     * or checked: a message nobody hears is harmless, and a waiter reads
     * the row before it waits. */
    RedisModuleString *row_name = NULL, *unique = NULL, *after = NULL, *waiters = NULL;
    EmqKey own;
    EmqKey *row = open_row;
    if (row == NULL) {
        row_name = emq_derived_key(e->ctx, e->base, "job:", id);
        emq_key_open(e->ctx, &own, row_name, REDISMODULE_READ);
        row = &own;
    }
    /* A field a listpack lacks costs a scan of the whole row: none is
     * looked for that the queue cannot have. */
    int readable = emq_type_ok(row, REDISMODULE_KEYTYPE_HASH) && !emq_key_empty(row);
    if (readable && deps)
        RedisModule_HashGet(row->key, REDISMODULE_HASH_NONE, emq_str.unique, &unique, emq_str.after, &after,
                            emq_str.waiters, &waiters, NULL);
    else if (readable)
        RedisModule_HashGet(row->key, REDISMODULE_HASH_NONE, emq_str.unique, &unique, NULL);
    if (row == &own) {
        emq_key_close(&own);
        RedisModule_FreeString(e->ctx, row_name);
    }
    int err = emq_unique_end_prepare(e, id, how, unique); /* takes `unique` */
    if (!err) err = emq_deps_end_prepare(e, id, how, already, after != NULL, waiters != NULL);
    if (after) RedisModule_FreeString(NULL, after);
    if (waiters) RedisModule_FreeString(NULL, waiters);
    return err;
}

/* Step: the announcement on <base>done:<id>, for the job's waiters. */
static void announce(EmqEnd *e, RedisModuleString *id) {
    RedisModuleString *channel = emq_derived_key(e->ctx, e->base, "done:", id);
    if (RedisModule_PublishMessageShard) RedisModule_PublishMessageShard(e->ctx, channel, id);
    else RedisModule_PublishMessage(e->ctx, channel, id);
    RedisModule_FreeString(e->ctx, channel);
}

void emq_ended_apply(EmqEnd *e, EmqFx *fx, RedisModuleString *id, int how, int already) {
    emq_unique_end_apply(e, fx, id);
    emq_deps_end_apply(e, fx, id, how, already);
    if (!already) announce(e, id);
}
