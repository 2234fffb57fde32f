/* emq_group.c -- see emq_group.h. */
#include "emq_group.h"

#include <stdint.h>
#include <string.h>

#include "emq.h"

void emq_groups_init(EmqGroups *g, RedisModuleCtx *ctx, RedisModuleString *base, RedisModuleUser *user) {
    memset(g, 0, sizeof *g);
    g->ctx = ctx;
    g->base = base;
    g->user = user;
    g->user_loaded = user != NULL;
}

void emq_groups_close(EmqGroups *g) {
    for (size_t i = 0; i < g->n; i++) {
        if (g->d[i].id) RedisModule_FreeString(NULL, g->d[i].id);
        RedisModule_FreeString(g->ctx, g->d[i].name);
    }
    RedisModule_Free(g->d);
    if (g->sums) RedisModule_FreeDict(NULL, g->sums);
    if (g->own_user && g->user) RedisModule_FreeModuleUser(g->user);
    memset(g, 0, sizeof *g);
}

/* <base>group:<g> may be read and written by the caller, is a hash (or
 * absent), and holds a count a write can move by `delta`. */
static int check_key(EmqGroups *g, RedisModuleString *name, long long delta) {
    int err = EMQ_OK;
    if (!g->user_loaded) {
        g->user_loaded = 1;
        g->own_user = 1;
        if (!emq_acl_user(g->ctx, &g->user)) err = EMQ_ERR_NOPERM_DERIVED;
    }
    EmqKey k = {0};
    if (!err) err = emq_open_derived(g->ctx, g->user, &k, name, EMQ_DERIVED_READ_WRITE);
    if (!err && !emq_type_ok(&k, REDISMODULE_KEYTYPE_HASH)) err = EMQ_ERR_WRONGTYPE;
    if (!err) {
        RedisModuleString *v = emq_hget(&k, emq_str.active);
        size_t len = 0;
        const char *p = v ? RedisModule_StringPtrLen(v, &len) : NULL;
        long long n;
        err = emq_parse_group_active(p, len, v != NULL, &n);
        if (!err && delta > 0 && n > EMQ_MAX_EXACT_SCORE - delta) err = EMQ_ERR_OVERFLOW;
        if (v) RedisModule_FreeString(NULL, v);
    }
    emq_key_close(&k);
    return err;
}

static EmqGroupDelta *add(EmqGroups *g, RedisModuleString *id, RedisModuleString *name, long long delta) {
    if (g->n == g->cap) {
        g->cap = g->cap ? 2 * g->cap : 4;
        g->d = RedisModule_Realloc(g->d, g->cap * sizeof *g->d);
    }
    EmqGroupDelta *d = &g->d[g->n++];
    if (id) RedisModule_RetainString(NULL, id);
    *d = (EmqGroupDelta){.id = id, .name = name, .delta = delta};
    return d;
}

int emq_groups_claimed(EmqGroups *g, EmqKey *row) {
    RedisModuleString *group = emq_hget(row, emq_str.group);
    if (group == NULL) return EMQ_OK;
    RedisModuleString *name = emq_derived_key(g->ctx, g->base, "group:", group);
    RedisModule_FreeString(NULL, group);
    if (g->sums == NULL) g->sums = RedisModule_CreateDict(NULL);
    size_t len;
    const char *p = RedisModule_StringPtrLen(name, &len);
    int missing = 0;
    uintptr_t at = (uintptr_t)RedisModule_DictGetC(g->sums, (void *)p, len, &missing);
    if (!missing && at > 0) {
        RedisModule_FreeString(g->ctx, name);
        g->d[at - 1].delta++; /* checked when first met; a claim takes at most 1,000 jobs */
        return EMQ_OK;
    }
    int err = check_key(g, name, 1);
    if (err) {
        RedisModule_FreeString(g->ctx, name);
        return err;
    }
    add(g, NULL, name, 1);
    RedisModule_DictSetC(g->sums, (void *)p, len, (void *)(uintptr_t)g->n);
    return EMQ_OK;
}

int emq_groups_left_prepare(EmqGroups *g, RedisModuleString *id, EmqKey *open_row) {
    RedisModuleString *group;
    if (open_row) {
        group = emq_type_ok(open_row, REDISMODULE_KEYTYPE_HASH) ? emq_hget(open_row, emq_str.group) : NULL;
    } else {
        RedisModuleString *row_name = emq_derived_key(g->ctx, g->base, "job:", id);
        EmqKey row;
        emq_key_open(g->ctx, &row, row_name, REDISMODULE_READ);
        group = emq_type_ok(&row, REDISMODULE_KEYTYPE_HASH) ? emq_hget(&row, emq_str.group) : NULL;
        emq_key_close(&row);
        RedisModule_FreeString(g->ctx, row_name);
    }
    if (group == NULL) return EMQ_OK;
    RedisModuleString *name = emq_derived_key(g->ctx, g->base, "group:", group);
    RedisModule_FreeString(NULL, group);
    int err = check_key(g, name, -1);
    if (err) {
        RedisModule_FreeString(g->ctx, name);
        return err;
    }
    add(g, id, name, -1);
    return EMQ_OK;
}

/* The count as it stands now, moved by `delta`, never below 0 (a count
 * already short -- a hand edit -- is not made shorter), written back. */
static void write_count(EmqGroups *g, EmqFx *fx, EmqGroupDelta *d) {
    EmqKey k;
    emq_key_open(g->ctx, &k, d->name, REDISMODULE_READ | REDISMODULE_WRITE);
    RedisModuleString *v = emq_type_ok(&k, REDISMODULE_KEYTYPE_HASH) ? emq_hget(&k, emq_str.active) : NULL;
    size_t len = 0;
    const char *p = v ? RedisModule_StringPtrLen(v, &len) : NULL;
    long long n = 0;
    if (emq_parse_group_active(p, len, v != NULL, &n) != EMQ_OK) n = 0; /* checked at prepare */
    if (v) RedisModule_FreeString(NULL, v);
    long long next = n + d->delta < 0 ? 0 : n + d->delta;
    if (next > 0) emq_fx_hset(fx, &k, "hset", 1, emq_str.active, emq_fx_number(fx, next));
    else if (v) emq_fx_hdel(fx, &k, emq_str.active);
    emq_key_close(&k);
    d->applied = 1;
}

void emq_groups_left_apply(EmqGroups *g, EmqFx *fx, RedisModuleString *id) {
    if (g->n == 0) return;
    size_t i = g->cursor % g->n;
    for (size_t tried = 0; tried < g->n; tried++, i = (i + 1) % g->n) {
        EmqGroupDelta *d = &g->d[i];
        if (d->applied || d->id == NULL || !emq_str_equal(d->id, id)) continue;
        write_count(g, fx, d);
        g->cursor = i + 1;
        return;
    }
}

void emq_groups_claimed_apply(EmqGroups *g, EmqFx *fx) {
    for (size_t i = 0; i < g->n; i++)
        if (!g->d[i].applied && g->d[i].id == NULL) write_count(g, fx, &g->d[i]);
}
