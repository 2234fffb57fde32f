/* emq_unique.c -- see emq_unique.h. */
#include "emq_unique.h"

#include <string.h>

#include "emq.h"

/* -- parse ---------------------------------------------------------------- */

/* FOR's window: a canonical integer from 1 to EMQ_UNIQUE_FOR_MAX. */
static int parse_for(RedisModuleString *arg, long long *ms) {
    size_t len;
    const char *s = RedisModule_StringPtrLen(arg, &len);
    if (emq_parse_ll(s, len, ms) != 0 || *ms < 1 || *ms > EMQ_UNIQUE_FOR_MAX) return EMQ_ERR_UNIQUE_FOR;
    return EMQ_OK;
}

int emq_unique_option(EmqUniqueOpts *u, RedisModuleString **argv, int i, int argc, int *err) {
    size_t len;
    const char *opt = RedisModule_StringPtrLen(argv[i], &len);
    int unique = emq_option_is(opt, len, "UNIQUE"), replace = emq_option_is(opt, len, "REPLACE");
    int for_ = emq_option_is(opt, len, "FOR"), until = emq_option_is(opt, len, "UNTIL");
    *err = EMQ_OK;
    if (u == NULL) {
        if (!unique) return 0;
        *err = EMQ_ERR_UNIQUE_MANY;
        return 1;
    }
    if (replace) {
        if (u->replace) *err = EMQ_ERR_SYNTAX;
        u->replace = 1;
        return 1;
    }
    if (!unique && !for_ && !until) return 0;
    if (i + 1 >= argc) {
        *err = EMQ_ERR_SYNTAX;
        return 1;
    }
    RedisModuleString *val = argv[i + 1];
    if (unique) {
        size_t klen;
        RedisModule_StringPtrLen(val, &klen);
        if (u->key) *err = EMQ_ERR_SYNTAX;
        else if (klen == 0 || klen > EMQ_UNIQUE_KEY_MAX) *err = EMQ_ERR_UNIQUE_KEY;
        else u->key = val;
    } else if (for_ || until) {
        int again = for_ ? u->for_ms != 0 : u->seen_until;
        int other = for_ ? u->seen_until : u->for_ms != 0;
        size_t vlen;
        const char *v = RedisModule_StringPtrLen(val, &vlen);
        if (again) *err = EMQ_ERR_SYNTAX;
        else if (other) *err = EMQ_ERR_UNIQUE_FOR_AND_UNTIL;
        else if (for_) *err = parse_for(val, &u->for_ms);
        else if (!emq_option_is(v, vlen, "DONE")) *err = EMQ_ERR_UNIQUE_UNTIL;
        else u->seen_until = 1;
    }
    return 2;
}

int emq_unique_options_check(const EmqUniqueOpts *u) {
    if (u->key == NULL && (u->replace || u->for_ms || u->seen_until)) return EMQ_ERR_UNIQUE_NEEDED;
    return EMQ_OK;
}

/* -- an enqueue ----------------------------------------------------------- */

/* A string key's value as a new string (NULL when empty or not a string). */
static RedisModuleString *string_value(EmqKey *k) {
    if (RedisModule_KeyType(k->key) != REDISMODULE_KEYTYPE_STRING) return NULL;
    size_t len;
    const char *p = RedisModule_StringDMA(k->key, &len, REDISMODULE_READ);
    return RedisModule_CreateString(NULL, p, len);
}

/* 1 when the row's `state` is `want`. */
static int state_is(EmqKey *row, RedisModuleString *want) {
    RedisModuleString *state = emq_hget(row, emq_str.state);
    int is = state != NULL && emq_str_equal(state, want);
    if (state) RedisModule_FreeString(NULL, state);
    return is;
}

void emq_unique_init(EmqUnique *u, RedisModuleCtx *ctx, const EmqUniqueOpts *opts) {
    memset(u, 0, sizeof *u);
    u->ctx = ctx;
    u->opts = opts;
    u->verdict = EMQ_UNIQUE_TAKE;
}

int emq_unique_decide(EmqUnique *u, RedisModuleUser *user, RedisModuleString *base) {
    RedisModuleCtx *ctx = u->ctx;
    const EmqUniqueOpts *opts = u->opts;
    if (opts->key == NULL) return EMQ_OK;
    u->name = emq_derived_key(ctx, base, "unique:", opts->key);
    int err = emq_open_derived(ctx, user, &u->key, u->name, EMQ_DERIVED_RECORD);
    if (err) return err;
    if (!emq_type_ok(&u->key, REDISMODULE_KEYTYPE_STRING)) return EMQ_ERR_WRONGTYPE;
    if (emq_key_empty(&u->key)) return EMQ_OK;
    u->holder = string_value(&u->key);
    int window = RedisModule_GetExpire(u->key.key) != REDISMODULE_NO_EXPIRE;
    /* The holder's row: read to tell a live holder from an orphan's, and
     * written when its payload is replaced. */
    u->holder_name = emq_derived_key(ctx, base, "job:", u->holder);
    err = emq_open_derived(ctx, user, &u->holder_row, u->holder_name,
                           opts->replace ? EMQ_DERIVED_READ_WRITE : EMQ_DERIVED_READ);
    if (err) return err;
    int pending = state_is(&u->holder_row, emq_str.pending);
    int live = pending || state_is(&u->holder_row, emq_str.active) || state_is(&u->holder_row, emq_str.waiting);
    if (!window && !live) return EMQ_OK; /* an orphan */
    u->verdict = opts->replace && pending ? EMQ_UNIQUE_REPLACE : EMQ_UNIQUE_HELD;
    return EMQ_OK;
}

void emq_unique_take(EmqUnique *u, EmqFx *fx, RedisModuleString *id, long long now) {
    if (u->opts->key == NULL) return;
    emq_fx_set(fx, &u->key, id);
    if (u->opts->for_ms) emq_fx_pexpireat(fx, &u->key, now + u->opts->for_ms);
}

void emq_unique_replace(EmqUnique *u, EmqFx *fx, RedisModuleString *payload) {
    RedisModuleString *fields[EMQ_MAX_PIECES], *values[EMQ_MAX_PIECES];
    int n = emq_row_pieces(fx, EMQ_VALUE_PAYLOAD, payload, fields, values);
    emq_row_drop_pieces(fx, &u->holder_row, EMQ_VALUE_PAYLOAD, n);
    emq_fx_hset_argv(fx, &u->holder_row, "hset", n, fields, values);
}

void emq_unique_reply(EmqUnique *u, RedisModuleString *id) {
    RedisModule_ReplyWithArray(u->ctx, 2);
    RedisModule_ReplyWithLongLong(u->ctx, u->verdict == EMQ_UNIQUE_TAKE ? 1 : u->verdict == EMQ_UNIQUE_HELD ? 0 : 2);
    RedisModule_ReplyWithString(u->ctx, u->verdict == EMQ_UNIQUE_TAKE ? id : u->holder);
}

void emq_unique_close(EmqUnique *u) {
    emq_key_close(&u->holder_row);
    emq_key_close(&u->key);
    if (u->holder_name) RedisModule_FreeString(u->ctx, u->holder_name);
    if (u->holder) RedisModule_FreeString(NULL, u->holder);
    if (u->name) RedisModule_FreeString(u->ctx, u->name);
}

/* -- a job's end ---------------------------------------------------------- */

/* The keys a command's ending jobs release, in the order their jobs were
 * prepared; apply finds each from a cursor (the verbs apply in the order
 * they prepared: one step each). */
struct EmqUniqueEnd {
    RedisModuleUser *user;
    int user_loaded;
    size_t n, cap, cursor;
    RedisModuleString **ids, **names; /* ids borrowed, names owned */
};

static EmqUniqueEnd *end_state(EmqEnd *e) {
    if (e->unique == NULL) {
        e->unique = RedisModule_Alloc(sizeof *e->unique);
        memset(e->unique, 0, sizeof *e->unique);
    }
    return e->unique;
}

int emq_unique_end_prepare(EmqEnd *e, RedisModuleString *id, int how, RedisModuleString *key) {
    /* `key`: the row's `unique` (read by emq_ended_prepare_row), freed here. */
    if (key == NULL) return EMQ_OK;

    EmqUniqueEnd *s = end_state(e);
    RedisModuleString *name = emq_derived_key(e->ctx, e->base, "unique:", key);
    RedisModule_FreeString(NULL, key);
    int err = EMQ_OK;
    if (!s->user_loaded) {
        s->user_loaded = 1;
        if (!emq_acl_user(e->ctx, &s->user)) err = EMQ_ERR_NOPERM_DERIVED;
    }
    EmqKey k = {0};
    if (!err) err = emq_open_derived(e->ctx, s->user, &k, name, EMQ_DERIVED_READ | EMQ_DERIVED_DELETE | EMQ_DERIVED_STRING);
    RedisModuleString *holder = err ? NULL : string_value(&k);
    /* Held by this job, and released by this end: an UNTIL key at any end,
     * a FOR window only when the row goes. */
    int release = holder != NULL && emq_str_equal(holder, id) &&
                  (how == EMQ_END_DELETED || RedisModule_GetExpire(k.key) == REDISMODULE_NO_EXPIRE);
    if (holder) RedisModule_FreeString(NULL, holder);
    emq_key_close(&k);
    if (!release) {
        RedisModule_FreeString(e->ctx, name);
        return err;
    }
    if (s->n == s->cap) {
        s->cap = s->cap ? 2 * s->cap : 4;
        s->ids = RedisModule_Realloc(s->ids, s->cap * sizeof *s->ids);
        s->names = RedisModule_Realloc(s->names, s->cap * sizeof *s->names);
    }
    s->ids[s->n] = id;
    s->names[s->n++] = name;
    return EMQ_OK;
}

void emq_unique_end_apply(EmqEnd *e, EmqFx *fx, RedisModuleString *id) {
    EmqUniqueEnd *s = e->unique;
    if (s == NULL || s->n == 0) return;
    size_t i = s->cursor;
    for (size_t tried = 0; tried < s->n; tried++, i = (i + 1) % s->n) {
        if (s->names[i] == NULL || !emq_str_equal(s->ids[i], id)) continue;
        EmqKey k;
        emq_key_open(e->ctx, &k, s->names[i], REDISMODULE_READ | REDISMODULE_WRITE);
        if (!emq_key_empty(&k)) emq_fx_del(fx, &k);
        emq_key_close(&k);
        RedisModule_FreeString(e->ctx, s->names[i]);
        s->names[i] = NULL;
        s->cursor = (i + 1) % s->n;
        return;
    }
}

void emq_unique_end_close(EmqEnd *e) {
    EmqUniqueEnd *s = e->unique;
    if (s == NULL) return;
    for (size_t i = 0; i < s->n; i++)
        if (s->names[i]) RedisModule_FreeString(e->ctx, s->names[i]);
    RedisModule_Free(s->ids);
    RedisModule_Free(s->names);
    if (s->user) RedisModule_FreeModuleUser(s->user);
    RedisModule_Free(s);
    e->unique = NULL;
}
