/* emq_keys.c -- see emq_keys.h. */
#include "emq_keys.h"

#include <math.h>
#include <string.h>

#include "emq.h"
#include "emq_schedules.h"

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

RedisModuleString *emq_base_of(RedisModuleCtx *ctx, RedisModuleString *key, const char *suffix) {
    size_t len;
    const char *k = RedisModule_StringPtrLen(key, &len);
    return RedisModule_CreateString(ctx, k, len - strlen(suffix));
}

/* -- opening and reading -------------------------------------------------- */

void emq_key_open(RedisModuleCtx *ctx, EmqKey *k, RedisModuleString *name, int mode) {
    k->ctx = ctx;
    k->key = RedisModule_OpenKey(ctx, name, mode);
    k->name = name;
    k->last = -1;
    k->modified = 0;
}

void emq_key_close(EmqKey *k) {
    if (k->key == NULL) return;
    RedisModule_CloseKey(k->key);
    k->key = NULL;
    /* The module signals only what it changed (emq.c turns the
     * server's implicit signal of every key opened for writing off). */
    if (k->modified) RedisModule_SignalModifiedKey(k->ctx, k->name);
    k->modified = 0;
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

size_t emq_zset_head(EmqKey *set, double max, long long limit, RedisModuleString ***ids) {
    size_t n = 0, cap = 0;
    *ids = NULL;
    if (emq_key_empty(set) || limit < 1) return 0;
    RedisModule_ZsetFirstInScoreRange(set->key, -HUGE_VAL, max, 0, 0);
    while (!RedisModule_ZsetRangeEndReached(set->key) && (long long)n < limit) {
        if (n == cap) {
            cap = cap ? cap * 2 : 16;
            *ids = RedisModule_Realloc(*ids, cap * sizeof **ids);
        }
        double score;
        (*ids)[n++] = RedisModule_ZsetRangeCurrentElement(set->key, &score);
        RedisModule_ZsetRangeNext(set->key);
    }
    RedisModule_ZsetRangeStop(set->key);
    return n;
}

/* -- keys derived from <base> ---------------------------------------------- */

/* A context of our own, without the caller's client flags, to ask the
 * server's cluster routing about a key; made once, on first need. */
static RedisModuleCtx *probe;

void emq_keys_unload(void) {
    if (probe) RedisModule_FreeThreadSafeContext(probe);
    probe = NULL;
}

/* Set by emq_slot_vouched_begin() for the length of one command. */
static int slot_vouched;

int emq_slot_vouched_begin(RedisModuleCtx *ctx, RedisModuleString **keys, int n) {
    int previous = slot_vouched;
    int flags = RedisModule_GetContextFlags(ctx);
    const int unchecked = REDISMODULE_CTX_FLAGS_LUA | REDISMODULE_CTX_FLAGS_MULTI |
                          REDISMODULE_CTX_FLAGS_REPLICATED | REDISMODULE_CTX_FLAGS_LOADING;
    if (!(flags & REDISMODULE_CTX_FLAGS_CLUSTER) || (flags & unchecked) || n < 2) return previous;
    for (int i = 0; i < n; i++) {
        for (int j = 0; j < i; j++)
            if (emq_str_equal(keys[i], keys[j])) return previous; /* one name twice: one key */
    }
    for (int i = 0; i < n; i++) {
        EmqKey k;
        emq_key_open(ctx, &k, keys[i], REDISMODULE_READ);
        int absent = emq_key_empty(&k);
        emq_key_close(&k);
        if (absent) {
            slot_vouched = 1;
            break;
        }
    }
    return previous;
}

void emq_slot_vouched_end(int previous) {
    slot_vouched = previous;
}

int emq_absent_key_is_final(RedisModuleCtx *ctx, RedisModuleString *name) {
    if (!(RedisModule_GetContextFlags(ctx) & REDISMODULE_CTX_FLAGS_CLUSTER)) return 1;
    if (slot_vouched) return 1;
    /* RedisModule_Call refuses a key this node would redirect (ASK to the
     * node a migrating slot goes to, or MOVED for a slot being imported
     * when the caller has not said ASKING), the rule the server applies to
     * declared keys.  Our context never has ASKING: on the importing node a
     * missing row may still be on the source, so it is never final there. */
    if (probe == NULL) probe = RedisModule_GetDetachedThreadSafeContext(ctx);
    RedisModule_SelectDb(probe, RedisModule_GetSelectedDb(ctx));
    RedisModuleCallReply *reply = RedisModule_Call(probe, "EXISTS", "s", name);
    if (reply == NULL) return 0;
    RedisModule_FreeCallReply(reply);
    return 1;
}

int emq_open_derived(RedisModuleCtx *ctx, RedisModuleUser *user, EmqKey *k, RedisModuleString *name,
                     int access) {
    k->ctx = ctx;
    k->key = NULL;
    k->name = name;
    k->last = -1;
    k->modified = 0;
    if (!emq_acl_may(user, name, access)) return EMQ_ERR_NOPERM_DERIVED;
    int writes = access & (EMQ_DERIVED_WRITE | EMQ_DERIVED_DELETE);
    int mode = writes ? REDISMODULE_READ | REDISMODULE_WRITE : REDISMODULE_READ;
    emq_key_open(ctx, k, name, mode);
    if (emq_key_empty(k) && !emq_absent_key_is_final(ctx, name)) return EMQ_ERR_TRYAGAIN;
    return EMQ_OK;
}

int emq_open_row(RedisModuleCtx *ctx, RedisModuleUser **user, EmqKey *row, RedisModuleString *name) {
    if (!emq_acl_user(ctx, user)) return EMQ_ERR_NOPERM_DERIVED;
    int err = emq_open_derived(ctx, *user, row, name, EMQ_DERIVED_READ_WRITE);
    if (!err && !emq_type_ok(row, REDISMODULE_KEYTYPE_HASH)) err = EMQ_ERR_WRONGTYPE;
    return err;
}

static int read_retention(EmqKey *k, RedisModuleString *field, long long *out) {
    RedisModuleString *v = emq_hget(k, field);
    if (v == NULL) return EMQ_OK;
    size_t len;
    const char *p = RedisModule_StringPtrLen(v, &len);
    int err = emq_parse_retention(p, len, out);
    RedisModule_FreeString(NULL, v);
    return err;
}

int emq_read_meta(RedisModuleCtx *ctx, RedisModuleUser *user, RedisModuleString *base, EmqMeta *meta) {
    meta->paused = 0;
    meta->deps = 0;
    meta->done_ttl = EMQ_DEFAULT_DONE_TTL_MS;
    meta->cancelled_ttl = EMQ_DEFAULT_CANCELLED_TTL_MS;
    meta->dead_ttl = EMQ_DEFAULT_DEAD_TTL_MS;
    EmqKey k;
    RedisModuleString *name = emq_derived_key(ctx, base, "meta", NULL);
    int err = emq_open_derived(ctx, user, &k, name, EMQ_DERIVED_READ);
    if (!err && !emq_type_ok(&k, REDISMODULE_KEYTYPE_HASH)) err = EMQ_ERR_WRONGTYPE;
    if (!err) {
        meta->paused = emq_hexists(&k, emq_str.paused);
        meta->deps = emq_hexists(&k, emq_str.deps);
        err = read_retention(&k, emq_str.done_ttl_ms, &meta->done_ttl);
        if (!err) err = read_retention(&k, emq_str.cancelled_ttl_ms, &meta->cancelled_ttl);
        if (!err) err = read_retention(&k, emq_str.dead_ttl_ms, &meta->dead_ttl);
    }
    emq_key_close(&k);
    RedisModule_FreeString(ctx, name);
    return err;
}

/* -- the fence ------------------------------------------------------------ */

int emq_check_holder(EmqKey *active, EmqKey *row, RedisModuleString *id, RedisModuleString *token) {
    RedisModuleString *current = emq_hget(row, emq_str.token);
    int matches = current != NULL && emq_str_equal(current, token);
    if (current) RedisModule_FreeString(NULL, current);
    double score;
    int active_member = matches && RedisModule_ZsetScore(active->key, id, &score) == REDISMODULE_OK;
    return emq_holder(current != NULL, matches, active_member);
}

int emq_check_holder_or_retry(EmqKey *active, EmqKey *row, RedisModuleString *id,
                              RedisModuleString *token, int verb, int *retry, int *route) {
    int holder = emq_check_holder(active, row, id, token);
    *retry = 0;
    *route = EMQ_FAIL_TO_PENDING;
    if (holder == EMQ_HOLDER_NOT_ACTIVE) {
        RedisModuleString *closed_by = emq_hget(row, emq_str.closed_by);
        size_t len = 0;
        const char *p = closed_by ? RedisModule_StringPtrLen(closed_by, &len) : NULL;
        *retry = emq_is_retry_of(verb, holder, p, len);
        if (*retry) *route = emq_closed_route(p, len);
        if (closed_by) RedisModule_FreeString(NULL, closed_by);
    }
    return holder;
}

/* -- ACL on derived keys -------------------------------------------------- */

int emq_acl_user(RedisModuleCtx *ctx, RedisModuleUser **user) {
    *user = NULL;
    /* Our own timer's calls (emq_schedules.c) run for no client: no user
     * to check, and some servers have none to name.  A client's command
     * never runs while the flag is up (the server runs one thing at once). */
    if (emq_schedules_internal_call()) return 1;
    if (!RedisModule_GetCurrentUserName || !RedisModule_GetModuleUserFromUserName ||
        !RedisModule_ACLCheckCommandPermissions || !RedisModule_FreeModuleUser)
        return 1;
    RedisModuleString *username = RedisModule_GetCurrentUserName(ctx);
    if (username == NULL) return 1; /* no client user: the server itself */
    *user = RedisModule_GetModuleUserFromUserName(username);
    RedisModule_FreeString(ctx, username);
    return *user != NULL;
}

/* May the user run `command` <key> [args...]?  The server's check of a core
 * command line, selector by selector (the field and value named are any:
 * only the command and the key decide). */
static int may_run(RedisModuleUser *user, RedisModuleString *command, RedisModuleString *key, int nargs) {
    RedisModuleString *argv[4] = {command, key, emq_str.state, emq_str.pending};
    return RedisModule_ACLCheckCommandPermissions(user, argv, 2 + nargs) == REDISMODULE_OK;
}

int emq_acl_may(RedisModuleUser *user, RedisModuleString *key, int access) {
    if (user == NULL) return 1;
    RedisModuleString *read = emq_str.acl_hget, *write = emq_str.acl_hset;
    int read_args = 1, write_args = 2;
    if (access & EMQ_DERIVED_STRING) {
        read = emq_str.acl_get, write = emq_str.acl_set;
        read_args = 0, write_args = 1;
    } else if (access & EMQ_DERIVED_ZSET) {
        read = emq_str.acl_zscore, write = emq_str.acl_zadd;
    }
    if ((access & EMQ_DERIVED_READ) && !may_run(user, read, key, read_args)) return 0;
    if ((access & EMQ_DERIVED_WRITE) && !may_run(user, write, key, write_args)) return 0;
    if ((access & EMQ_DERIVED_DELETE) && !may_run(user, emq_str.acl_del, key, 0)) return 0;
    return 1;
}
