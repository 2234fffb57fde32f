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
        if (g->d[i].group) RedisModule_FreeString(NULL, g->d[i].group);
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
    if (g->sums == NULL) g->sums = RedisModule_CreateDict(NULL);
    size_t len;
    const char *p = RedisModule_StringPtrLen(name, &len);
    int missing = 0;
    uintptr_t at = (uintptr_t)RedisModule_DictGetC(g->sums, (void *)p, len, &missing);
    if (!missing && at > 0) {
        RedisModule_FreeString(g->ctx, name);
        RedisModule_FreeString(NULL, group);
        g->d[at - 1].delta++; /* checked when first met; a claim takes at most 1,000 jobs */
        return EMQ_OK;
    }
    int err = check_key(g, name, 1);
    if (!err) err = emq_group_index_check(g->ctx, g->user, g->base);
    if (err) {
        RedisModule_FreeString(g->ctx, name);
        RedisModule_FreeString(NULL, group);
        return err;
    }
    add(g, NULL, name, 1)->group = group;
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
    int err = check_key(g, name, -1);
    if (!err) err = emq_group_settle_check(g->ctx, g->user, g->base, group);
    if (err) {
        RedisModule_FreeString(NULL, group);
        RedisModule_FreeString(g->ctx, name);
        return err;
    }
    add(g, id, name, -1)->group = group;
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
    int existed = emq_type_ok(&k, REDISMODULE_KEYTYPE_HASH) && !emq_key_empty(&k);
    if (next > 0) emq_fx_hset(fx, &k, "hset", 1, emq_str.active, emq_fx_number(fx, next));
    else if (v) emq_fx_hdel(fx, &k, emq_str.active);
    emq_group_index_sync(g->ctx, fx, g->base, d->group, existed, &k);
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
        if (!g->defer_settle) emq_group_settle(g->ctx, fx, g->base, d->group, NULL); /* a slot freed */
        return;
    }
}

void emq_groups_settle_deferred(EmqGroups *g, EmqFx *fx) {
    for (size_t i = 0; i < g->n; i++)
        if (g->d[i].applied && g->d[i].group) emq_group_settle(g->ctx, fx, g->base, g->d[i].group, NULL);
}

void emq_groups_claimed_apply(EmqGroups *g, EmqFx *fx) {
    for (size_t i = 0; i < g->n; i++)
        if (!g->d[i].applied && g->d[i].id == NULL) write_count(g, fx, &g->d[i]);
}

/* <base>meta's `group_max`: the cap of every group without its own. */
int emq_group_default_cap(RedisModuleCtx *ctx, RedisModuleString *base, long long *cap) {
    RedisModuleString *mname = emq_derived_key(ctx, base, "meta", NULL);
    EmqKey meta;
    emq_key_open(ctx, &meta, mname, REDISMODULE_READ);
    RedisModuleString *v = NULL;
    if (emq_type_ok(&meta, REDISMODULE_KEYTYPE_HASH) && !emq_key_empty(&meta)) v = emq_hget(&meta, emq_str.group_max);
    size_t len = 0;
    const char *p = v ? RedisModule_StringPtrLen(v, &len) : NULL;
    int err = emq_parse_group_max_field(p, len, v != NULL, cap) ? EMQ_ERR_GROUP_DEFAULT_FIELD : EMQ_OK;
    if (v) RedisModule_FreeString(NULL, v);
    emq_key_close(&meta);
    RedisModule_FreeString(ctx, mname);
    return err;
}

int emq_group_caps_read(RedisModuleCtx *ctx, RedisModuleString *base, EmqKey *hash, long long *active,
                        long long *cap) {
    *active = 0;
    *cap = EMQ_NO_CAP;
    if (!emq_type_ok(hash, REDISMODULE_KEYTYPE_HASH)) return EMQ_OK;
    if (emq_key_empty(hash)) return emq_group_default_cap(ctx, base, cap);
    RedisModuleString *v = emq_hget(hash, emq_str.active);
    size_t len = 0;
    const char *p = v ? RedisModule_StringPtrLen(v, &len) : NULL;
    if (emq_parse_group_active(p, len, v != NULL, active) != EMQ_OK) *active = 0;
    if (v) RedisModule_FreeString(NULL, v);
    v = emq_hget(hash, emq_str.max);
    p = v ? RedisModule_StringPtrLen(v, &len) : NULL;
    int err = emq_parse_group_max_field(p, len, v != NULL, cap);
    if (v) RedisModule_FreeString(NULL, v);
    if (!err && v == NULL) err = emq_group_default_cap(ctx, base, cap);
    return err;
}

int emq_group_settle_check(RedisModuleCtx *ctx, RedisModuleUser *user, RedisModuleString *base,
                           RedisModuleString *group) {
    static const struct {
        const char *suffix;
        int with_group, access, type;
    } keys[] = {{"g:", 1, EMQ_DERIVED_LANE, REDISMODULE_KEYTYPE_ZSET},
                {"groups", 0, EMQ_DERIVED_READ_WRITE, REDISMODULE_KEYTYPE_LIST},
                {"meta", 0, EMQ_DERIVED_READ_WRITE, REDISMODULE_KEYTYPE_HASH},
                {"groupset", 0, EMQ_DERIVED_LANE, REDISMODULE_KEYTYPE_ZSET}};
    int err = EMQ_OK;
    for (size_t i = 0; !err && i < sizeof keys / sizeof *keys; i++) {
        RedisModuleString *name = emq_derived_key(ctx, base, keys[i].suffix, keys[i].with_group ? group : NULL);
        EmqKey k = {0};
        err = emq_open_derived(ctx, user, &k, name, keys[i].access);
        if (!err && !emq_type_ok(&k, keys[i].type)) err = EMQ_ERR_WRONGTYPE;
        emq_key_close(&k);
        RedisModule_FreeString(ctx, name);
    }
    return err;
}

void emq_group_settle(RedisModuleCtx *ctx, EmqFx *fx, RedisModuleString *base, RedisModuleString *group,
                      EmqKey *ring) {
    const int rw = REDISMODULE_READ | REDISMODULE_WRITE;
    RedisModuleString *hname = emq_derived_key(ctx, base, "group:", group);
    EmqKey h;
    emq_key_open(ctx, &h, hname, rw);
    long long active, cap;
    int may = emq_type_ok(&h, REDISMODULE_KEYTYPE_HASH) && !emq_hexists(&h, emq_str.ring) &&
              emq_group_caps_read(ctx, base, &h, &active, &cap) == EMQ_OK;
    if (may) {
        RedisModuleString *lname = emq_derived_key(ctx, base, "g:", group);
        EmqKey lane;
        emq_key_open(ctx, &lane, lname, REDISMODULE_READ);
        int has = emq_type_ok(&lane, REDISMODULE_KEYTYPE_ZSET) && !emq_key_empty(&lane);
        emq_key_close(&lane);
        RedisModule_FreeString(ctx, lname);
        may = emq_group_claimable(has, emq_hexists(&h, emq_str.paused), active, cap);
    }
    if (may) {
        EmqKey own = {0};
        RedisModuleString *rname = NULL;
        if (ring == NULL) {
            rname = emq_derived_key(ctx, base, "groups", NULL);
            emq_key_open(ctx, &own, rname, rw);
            ring = &own;
        }
        if (emq_type_ok(ring, REDISMODULE_KEYTYPE_LIST)) {
            RedisModuleString *m[2] = {emq_str.empty, group};
            int fresh = emq_key_empty(ring); /* a new ring starts with the empty name */
            emq_fx_push(fx, ring, 0, fresh ? m : m + 1, fresh ? 2 : 1);
            int existed = !emq_key_empty(&h);
            emq_fx_hset(fx, &h, "hset", 1, emq_str.ring, emq_fx_number(fx, 1));
            emq_group_index_sync(ctx, fx, base, group, existed, &h);
            RedisModuleString *mname = emq_derived_key(ctx, base, "meta", NULL);
            EmqKey meta;
            emq_key_open(ctx, &meta, mname, rw);
            if (emq_type_ok(&meta, REDISMODULE_KEYTYPE_HASH) && !emq_hexists(&meta, emq_str.ring))
                emq_fx_hset(fx, &meta, "hset", 1, emq_str.ring, emq_fx_number(fx, 1));
            emq_key_close(&meta);
            RedisModule_FreeString(ctx, mname);
            RedisModuleString *pending = emq_derived_key(ctx, base, "pending", NULL);
            emq_signal_claimable(ctx, pending);
            RedisModule_FreeString(ctx, pending);
        }
        if (rname) {
            emq_key_close(&own);
            RedisModule_FreeString(ctx, rname);
        }
    }
    emq_key_close(&h);
    RedisModule_FreeString(ctx, hname);
}

int emq_group_index_check(RedisModuleCtx *ctx, RedisModuleUser *user, RedisModuleString *base) {
    RedisModuleString *name = emq_derived_key(ctx, base, "groupset", NULL);
    EmqKey k = {0};
    int err = emq_open_derived(ctx, user, &k, name, EMQ_DERIVED_LANE);
    if (!err && !emq_type_ok(&k, REDISMODULE_KEYTYPE_ZSET)) err = EMQ_ERR_WRONGTYPE;
    emq_key_close(&k);
    RedisModule_FreeString(ctx, name);
    return err;
}

void emq_group_index_sync(RedisModuleCtx *ctx, EmqFx *fx, RedisModuleString *base, RedisModuleString *group,
                          int existed, EmqKey *h) {
    int exists = emq_type_ok(h, REDISMODULE_KEYTYPE_HASH) && !emq_key_empty(h);
    if (group == NULL || exists == existed) return;
    RedisModuleString *name = emq_derived_key(ctx, base, "groupset", NULL);
    EmqKey k;
    emq_key_open(ctx, &k, name, REDISMODULE_READ | REDISMODULE_WRITE);
    if (emq_type_ok(&k, REDISMODULE_KEYTYPE_ZSET)) {
        if (exists) emq_fx_zadd(fx, &k, 0, group, 0);
        else emq_fx_zrem(fx, &k, group);
    }
    emq_key_close(&k);
    RedisModule_FreeString(ctx, name);
}
