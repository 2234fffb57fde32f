/* emq_glue.c -- see emq_glue.h. */
#include "emq_glue.h"

#include <stdio.h>
#include <string.h>

#include "emq_core.h"

int emq_str_equal(RedisModuleString *a, RedisModuleString *b) {
    size_t alen, blen;
    const char *ap = RedisModule_StringPtrLen(a, &alen), *bp = RedisModule_StringPtrLen(b, &blen);
    return alen == blen && memcmp(ap, bp, alen) == 0;
}

int emq_type_ok(RedisModuleKey *key, int keytype) {
    int t = RedisModule_KeyType(key);
    return t == REDISMODULE_KEYTYPE_EMPTY || t == keytype;
}

RedisModuleString *emq_derived_key(RedisModuleCtx *ctx, RedisModuleString *base, const char *mid,
                                   RedisModuleString *tail) {
    size_t baselen, taillen = 0, midlen = strlen(mid);
    const char *b = RedisModule_StringPtrLen(base, &baselen);
    const char *t = tail ? RedisModule_StringPtrLen(tail, &taillen) : NULL;
    size_t len = baselen + midlen + taillen;
    char *buf = RedisModule_Alloc(len ? len : 1);
    memcpy(buf, b, baselen);
    memcpy(buf + baselen, mid, midlen);
    if (taillen) memcpy(buf + baselen + midlen, t, taillen);
    RedisModuleString *name = RedisModule_CreateString(ctx, buf, len);
    RedisModule_Free(buf);
    return name;
}

const char *emq_check_queue_keys(RedisModuleString **keys, const char *const *suffix, int n,
                                 RedisModuleString *base, const char *mismatch) {
    size_t baselen, len;
    const char *b = RedisModule_StringPtrLen(base, &baselen);
    for (int i = 0; i < n; i++) {
        const char *k = RedisModule_StringPtrLen(keys[i], &len);
        if (!emq_key_is(k, len, b, baselen, suffix[i])) return mismatch;
    }
    return NULL;
}

const char *emq_check_cluster_base(RedisModuleCtx *ctx, RedisModuleString *base) {
    size_t baselen;
    const char *b = RedisModule_StringPtrLen(base, &baselen);
    if ((RedisModule_GetContextFlags(ctx) & REDISMODULE_CTX_FLAGS_CLUSTER) &&
        !emq_base_has_hash_tag(b, baselen))
        return "ERR in cluster mode <base> must contain a hash tag, e.g. emq:{queue}:";
    return NULL;
}

const char *emq_check_queue(RedisModuleCtx *ctx, RedisModuleString **keys, const char *const *suffix,
                            int n, RedisModuleString *base, const char *mismatch) {
    const char *err = emq_check_queue_keys(keys, suffix, n, base, mismatch);
    return err ? err : emq_check_cluster_base(ctx, base);
}

const char *emq_check_pending_queue(RedisModuleCtx *ctx, RedisModuleString *pending,
                                    RedisModuleString *base) {
    static const char *const pending_only[] = {"pending"};
    return emq_check_queue(ctx, &pending, pending_only, 1, base, "ERR <pending> must be <base>pending");
}

int emq_acl_user(RedisModuleCtx *ctx, RedisModuleUser **user) {
    *user = NULL;
    if (!RedisModule_GetCurrentUserName || !RedisModule_GetModuleUserFromUserName ||
        !RedisModule_ACLCheckKeyPermissions || !RedisModule_FreeModuleUser)
        return 1;
    RedisModuleString *username = RedisModule_GetCurrentUserName(ctx);
    if (username == NULL) return 1; /* no client user: the server itself */
    *user = RedisModule_GetModuleUserFromUserName(username);
    RedisModule_FreeString(ctx, username);
    return *user != NULL;
}

int emq_acl_may_touch(RedisModuleUser *user, RedisModuleString *key) {
    if (user == NULL) return 1;
    /* Rows and the metric are read, then updated or created. */
    const int flags = (int)(REDISMODULE_CMD_KEY_ACCESS | REDISMODULE_CMD_KEY_UPDATE |
                            REDISMODULE_CMD_KEY_INSERT);
    return RedisModule_ACLCheckKeyPermissions(user, key, flags) == REDISMODULE_OK;
}

int emq_acl_allows(RedisModuleCtx *ctx, RedisModuleString *const *names, size_t n) {
    RedisModuleUser *user;
    if (!emq_acl_user(ctx, &user)) return 0;
    int allowed = 1;
    for (size_t i = 0; allowed && i < n; i++)
        if (names[i]) allowed = emq_acl_may_touch(user, names[i]);
    if (user) RedisModule_FreeModuleUser(user);
    return allowed;
}

const char *emq_hash_incr(RedisModuleCtx *ctx, RedisModuleKey *key, const char *field,
                          emq_incr_fn incr, long long *next) {
    RedisModuleString *cur = NULL;
    if (RedisModule_KeyType(key) == REDISMODULE_KEYTYPE_HASH)
        RedisModule_HashGet(key, REDISMODULE_HASH_CFIELDS, field, &cur, NULL);
    size_t len = 0;
    const char *p = cur ? RedisModule_StringPtrLen(cur, &len) : NULL;
    const char *err = incr(p, len, cur != NULL, next);
    if (cur) RedisModule_FreeString(ctx, cur);
    return err;
}

RedisModuleString *emq_ll_string(RedisModuleCtx *ctx, long long v) {
    char buf[24];
    int n = snprintf(buf, sizeof buf, "%lld", v);
    return RedisModule_CreateString(ctx, buf, (size_t)n);
}

EmqHolder emq_check_holder(RedisModuleCtx *ctx, RedisModuleKey *active, RedisModuleKey *row,
                           RedisModuleString *id, RedisModuleString *token, long long *attempts_out) {
    RedisModuleString *attempts = NULL;
    if (RedisModule_KeyType(row) == REDISMODULE_KEYTYPE_HASH)
        RedisModule_HashGet(row, REDISMODULE_HASH_CFIELDS, "attempts", &attempts, NULL);
    if (attempts == NULL) return EMQ_HOLDER_GONE;
    int same = emq_str_equal(attempts, token);
    if (same && attempts_out) {
        size_t len;
        const char *p = RedisModule_StringPtrLen(attempts, &len);
        if (emq_parse_ll(p, len, attempts_out) != 0) *attempts_out = -1;
    }
    RedisModule_FreeString(ctx, attempts);
    if (!same) return EMQ_HOLDER_STALE_TOKEN;
    double score;
    if (RedisModule_ZsetScore(active, id, &score) != REDISMODULE_OK) return EMQ_HOLDER_NOT_ACTIVE;
    return EMQ_HOLDER_OK;
}

int emq_has_cancel_request(RedisModuleKey *row) {
    if (RedisModule_KeyType(row) != REDISMODULE_KEYTYPE_HASH) return 0;
    int exists = 0;
    RedisModule_HashGet(row, REDISMODULE_HASH_CFIELDS | REDISMODULE_HASH_EXISTS, "cancel_requested",
                        &exists, NULL);
    return exists;
}

void emq_zrem(RedisModuleCtx *ctx, RedisModuleKey *set, RedisModuleString *set_name,
              RedisModuleString *id) {
    int deleted = 0;
    RedisModule_ZsetRem(set, id, &deleted);
    if (!deleted) return;
    RedisModule_NotifyKeyspaceEvent(ctx, REDISMODULE_NOTIFY_ZSET, "zrem", set_name);
    /* The API deletes a set it emptied, silently; ZREM says "del". */
    if (RedisModule_KeyType(set) == REDISMODULE_KEYTYPE_EMPTY)
        RedisModule_NotifyKeyspaceEvent(ctx, REDISMODULE_NOTIFY_GENERIC, "del", set_name);
}

void emq_zadd(RedisModuleCtx *ctx, RedisModuleKey *set, RedisModuleString *set_name, double score,
              RedisModuleString *id) {
    int flags = 0;
    RedisModule_ZsetAdd(set, score, id, &flags);
    if (flags & (REDISMODULE_ZADD_ADDED | REDISMODULE_ZADD_UPDATED))
        RedisModule_NotifyKeyspaceEvent(ctx, REDISMODULE_NOTIFY_ZSET, "zadd", set_name);
}

void emq_notify_hset(RedisModuleCtx *ctx, RedisModuleString *row_name) {
    RedisModule_NotifyKeyspaceEvent(ctx, REDISMODULE_NOTIFY_HASH, "hset", row_name);
}
