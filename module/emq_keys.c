/* emq_keys.c -- see emq_keys.h. */
#include "emq_keys.h"

#include <string.h>

#include "emq.h"

/* -- checks --------------------------------------------------------------- */

int emq_check_queue_keys(RedisModuleString **keys, const char *const *suffix, int n,
                         RedisModuleString *base, int mismatch) {
    size_t baselen, len;
    const char *b = RedisModule_StringPtrLen(base, &baselen);
    for (int i = 0; i < n; i++) {
        const char *k = RedisModule_StringPtrLen(keys[i], &len);
        if (!emq_key_is(k, len, b, baselen, suffix[i])) return mismatch;
    }
    return EMQ_OK;
}

int emq_check_cluster_base(RedisModuleCtx *ctx, RedisModuleString *base) {
    size_t baselen;
    const char *b = RedisModule_StringPtrLen(base, &baselen);
    if ((RedisModule_GetContextFlags(ctx) & REDISMODULE_CTX_FLAGS_CLUSTER) &&
        !emq_base_has_hash_tag(b, baselen))
        return EMQ_ERR_NO_HASH_TAG;
    return EMQ_OK;
}

int emq_check_queue(RedisModuleCtx *ctx, RedisModuleString **keys, const char *const *suffix, int n,
                    RedisModuleString *base, int mismatch) {
    int err = emq_check_queue_keys(keys, suffix, n, base, mismatch);
    return err ? err : emq_check_cluster_base(ctx, base);
}

/* -- names ---------------------------------------------------------------- */

RedisModuleString *emq_derived_key(RedisModuleCtx *ctx, RedisModuleString *base, const char *mid,
                                   RedisModuleString *tail) {
    size_t baselen, taillen = 0, midlen = strlen(mid);
    const char *b = RedisModule_StringPtrLen(base, &baselen);
    const char *t = tail ? RedisModule_StringPtrLen(tail, &taillen) : NULL;
    size_t len = baselen + midlen + taillen;
    /* Names are short: build them on the stack, on the heap only when long. */
    char small[256];
    char *buf = len <= sizeof small ? small : RedisModule_Alloc(len);
    memcpy(buf, b, baselen);
    memcpy(buf + baselen, mid, midlen);
    if (taillen) memcpy(buf + baselen + midlen, t, taillen);
    RedisModuleString *name = RedisModule_CreateString(ctx, buf, len);
    if (buf != small) RedisModule_Free(buf);
    return name;
}

/* -- opening and reading -------------------------------------------------- */

void emq_key_open(RedisModuleCtx *ctx, EmqKey *k, RedisModuleString *name, int mode) {
    k->key = RedisModule_OpenKey(ctx, name, mode);
    k->name = name;
    k->last = -1;
    k->modified = 0;
}

void emq_key_close(EmqKey *k) {
    if (k->key) RedisModule_CloseKey(k->key);
    k->key = NULL;
}

int emq_type_ok(EmqKey *k, int keytype) {
    int t = RedisModule_KeyType(k->key);
    return t == REDISMODULE_KEYTYPE_EMPTY || t == keytype;
}

int emq_key_empty(EmqKey *k) {
    return RedisModule_KeyType(k->key) == REDISMODULE_KEYTYPE_EMPTY;
}

RedisModuleString *emq_hget(EmqKey *k, RedisModuleString *field) {
    RedisModuleString *value = NULL;
    if (RedisModule_KeyType(k->key) == REDISMODULE_KEYTYPE_HASH)
        RedisModule_HashGet(k->key, REDISMODULE_HASH_NONE, field, &value, NULL);
    return value;
}

int emq_hexists(EmqKey *k, RedisModuleString *field) {
    if (RedisModule_KeyType(k->key) != REDISMODULE_KEYTYPE_HASH) return 0;
    int exists = 0;
    RedisModule_HashGet(k->key, REDISMODULE_HASH_EXISTS, field, &exists, NULL);
    return exists;
}

int emq_hash_incr(EmqKey *k, RedisModuleString *field, long long add, int not_integer,
                  long long *next) {
    RedisModuleString *cur = emq_hget(k, field);
    size_t len = 0;
    const char *p = cur ? RedisModule_StringPtrLen(cur, &len) : NULL;
    int err = emq_incr(p, len, cur != NULL, add, not_integer, next);
    if (cur) RedisModule_FreeString(NULL, cur);
    return err;
}

int emq_str_equal(RedisModuleString *a, RedisModuleString *b) {
    size_t alen, blen;
    const char *ap = RedisModule_StringPtrLen(a, &alen), *bp = RedisModule_StringPtrLen(b, &blen);
    return alen == blen && memcmp(ap, bp, alen) == 0;
}

/* -- the fence ------------------------------------------------------------ */

int emq_check_holder(EmqKey *active, EmqKey *row, RedisModuleString *id, RedisModuleString *token,
                     long long *attempts_out) {
    RedisModuleString *attempts = emq_hget(row, emq_str.attempts);
    int matches = attempts != NULL && emq_str_equal(attempts, token);
    if (matches && attempts_out) {
        size_t len;
        const char *p = RedisModule_StringPtrLen(attempts, &len);
        if (emq_parse_ll(p, len, attempts_out) != 0) *attempts_out = -1;
    }
    if (attempts) RedisModule_FreeString(NULL, attempts);
    double score;
    int active_member = matches && RedisModule_ZsetScore(active->key, id, &score) == REDISMODULE_OK;
    return emq_holder(attempts != NULL, matches, active_member);
}

/* -- ACL on derived keys -------------------------------------------------- */

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

int emq_acl_may_touch_to(RedisModuleUser *user, RedisModuleString *key, int flags) {
    if (user == NULL) return 1;
    return RedisModule_ACLCheckKeyPermissions(user, key, flags) == REDISMODULE_OK;
}

int emq_acl_may_touch(RedisModuleUser *user, RedisModuleString *key) {
    return emq_acl_may_touch_to(user, key, EMQ_DERIVED_READ_WRITE);
}

int emq_acl_allows_to(RedisModuleCtx *ctx, RedisModuleString *const *names, size_t n, int flags) {
    RedisModuleUser *user;
    if (!emq_acl_user(ctx, &user)) return 0;
    int allowed = 1;
    for (size_t i = 0; allowed && i < n; i++)
        if (names[i]) allowed = emq_acl_may_touch_to(user, names[i], flags);
    if (user) RedisModule_FreeModuleUser(user);
    return allowed;
}

int emq_acl_allows(RedisModuleCtx *ctx, RedisModuleString *const *names, size_t n) {
    return emq_acl_allows_to(ctx, names, n, EMQ_DERIVED_READ_WRITE);
}
