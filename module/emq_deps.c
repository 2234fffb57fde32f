/* emq_deps.c -- see emq_deps.h. */
#include "emq_deps.h"

#include <math.h>
#include <string.h>

#include "emq.h"

/* -- parse ---------------------------------------------------------------- */

int emq_deps_option(EmqDepsOpts *d, RedisModuleString **argv, int i, int argc, int *err) {
    size_t len;
    const char *opt = RedisModule_StringPtrLen(argv[i], &len);
    int after = emq_option_is(opt, len, "AFTER"), policy = emq_option_is(opt, len, "ON_PARENT_FAILURE");
    int missing = emq_option_is(opt, len, "MISSING");
    *err = EMQ_OK;
    if (!after && !policy && !missing) return 0;
    if (d == NULL) {
        *err = EMQ_ERR_AFTER_MANY;
        return 1;
    }
    if (after) {
        /* AFTER is the last option: every argument after it is an id. */
        int n = argc - i - 1;
        if (n < 1 || d->seen_after) *err = EMQ_ERR_SYNTAX;
        else if (n > EMQ_DEPS_MAX) *err = EMQ_ERR_AFTER_TOO_MANY;
        if (*err) return 1;
        d->seen_after = 1;
        d->ids = RedisModule_Alloc((size_t)n * sizeof *d->ids);
        RedisModuleDict *seen = RedisModule_CreateDict(NULL);
        for (int k = 0; k < n; k++) {
            size_t ilen;
            const char *s = RedisModule_StringPtrLen(argv[i + 1 + k], &ilen);
            if (ilen == 0) {
                *err = EMQ_ERR_AFTER_EMPTY_ID;
                break;
            }
            if (RedisModule_DictSetC(seen, (void *)s, ilen, (void *)1) == REDISMODULE_OK)
                d->ids[d->n++] = argv[i + 1 + k];
        }
        RedisModule_FreeDict(NULL, seen);
        return argc - i;
    }
    if (i + 1 >= argc) {
        *err = EMQ_ERR_SYNTAX;
        return 1;
    }
    size_t vlen;
    const char *v = RedisModule_StringPtrLen(argv[i + 1], &vlen);
    if (policy) {
        if (d->seen_policy) *err = EMQ_ERR_SYNTAX;
        else if (emq_option_is(v, vlen, "FAIL")) d->policy = EMQ_POLICY_FAIL;
        else if (emq_option_is(v, vlen, "IGNORE")) d->policy = EMQ_POLICY_IGNORE;
        else if (emq_option_is(v, vlen, "CONTINUE")) d->policy = EMQ_POLICY_CONTINUE;
        else *err = EMQ_ERR_AFTER_POLICY;
        d->seen_policy = 1;
    } else {
        if (d->seen_missing) *err = EMQ_ERR_SYNTAX;
        else if (emq_option_is(v, vlen, "DONE")) d->missing_done = 1;
        else *err = EMQ_ERR_AFTER_MISSING;
        d->seen_missing = 1;
    }
    return 2;
}

int emq_deps_options_check(EmqDepsOpts *d, RedisModuleString *id) {
    if (!d->seen_after && (d->seen_policy || d->seen_missing)) return EMQ_ERR_AFTER_NEEDED;
    for (int k = 0; k < d->n; k++)
        if (emq_str_equal(d->ids[k], id)) return EMQ_ERR_AFTER_SELF;
    return EMQ_OK;
}

void emq_deps_opts_free(EmqDepsOpts *d) {
    RedisModule_Free(d->ids);
    d->ids = NULL;
}

static const char *policy_name(int policy) {
    return policy == EMQ_POLICY_IGNORE ? "ignore" : policy == EMQ_POLICY_CONTINUE ? "continue" : "fail";
}

static int parse_policy(RedisModuleString *v) {
    if (v == NULL) return EMQ_POLICY_FAIL;
    size_t len;
    const char *s = RedisModule_StringPtrLen(v, &len);
    if (len == 6 && memcmp(s, "ignore", 6) == 0) return EMQ_POLICY_IGNORE;
    if (len == 8 && memcmp(s, "continue", 8) == 0) return EMQ_POLICY_CONTINUE;
    return EMQ_POLICY_FAIL;
}

/* `dependency <id> <how>`: the reason a waiter under `fail` dies. */
static RedisModuleString *death_reason(RedisModuleCtx *ctx, RedisModuleString *dep, RedisModuleString *how) {
    size_t dl, hl;
    const char *d = RedisModule_StringPtrLen(dep, &dl);
    const char *h = RedisModule_StringPtrLen(how, &hl);
    RedisModuleString *s = RedisModule_CreateString(ctx, "dependency ", 11);
    char *buf = RedisModule_Alloc(11 + dl + 1 + hl);
    memcpy(buf, "dependency ", 11);
    memcpy(buf + 11, d, dl);
    buf[11 + dl] = ' ';
    memcpy(buf + 12 + dl, h, hl);
    RedisModule_FreeString(ctx, s);
    s = RedisModule_CreateString(ctx, buf, 12 + dl + hl);
    RedisModule_Free(buf);
    return s;
}

static int failed_how(RedisModuleString *how) {
    return !emq_str_equal(how, emq_str.done) && !emq_str_equal(how, emq_str.missing);
}

/* -- an enqueue ----------------------------------------------------------- */

void emq_deps_init(EmqDeps *d, RedisModuleCtx *ctx, const EmqDepsOpts *opts) {
    memset(d, 0, sizeof *d);
    d->ctx = ctx;
    d->opts = opts;
    d->verdict = EMQ_DEPS_NONE;
}

int emq_deps_decide(EmqDeps *d, RedisModuleUser *user, RedisModuleString *base, RedisModuleString *id) {
    (void)id;
    const EmqDepsOpts *o = d->opts;
    if (!o->seen_after) return EMQ_OK;
    RedisModuleCtx *ctx = d->ctx;
    /* <base>meta's `deps`: the queue has had a dependency, so its ends look
     * for them (a queue that never had one reads no row field for them). */
    d->meta_name = emq_derived_key(ctx, base, "meta", NULL);
    int err = emq_open_derived(ctx, user, &d->meta, d->meta_name, EMQ_DERIVED_READ_WRITE);
    if (!err && !emq_type_ok(&d->meta, REDISMODULE_KEYTYPE_HASH)) err = EMQ_ERR_WRONGTYPE;
    if (err) return err;
    int n = o->n;
    d->outcome = RedisModule_Alloc((size_t)n * sizeof *d->outcome);
    d->waiters = RedisModule_Alloc((size_t)n * sizeof *d->waiters);
    d->names = RedisModule_Alloc((size_t)n * sizeof *d->names);
    memset(d->waiters, 0, (size_t)n * sizeof *d->waiters);
    memset(d->names, 0, (size_t)n * sizeof *d->names);
    d->verdict = EMQ_DEPS_MET;
    for (int k = 0; k < n && !err; k++) {
        d->outcome[k] = NULL;
        RedisModuleString *row_name = emq_derived_key(ctx, base, "job:", o->ids[k]);
        EmqKey row = {0};
        /* Read, and marked `waiters` (the hint its end looks for). */
        err = emq_open_derived(ctx, user, &row, row_name, EMQ_DERIVED_READ_WRITE);
        RedisModule_FreeString(ctx, row_name);
        RedisModuleString *state = err ? NULL : emq_hget(&row, emq_str.state);
        emq_key_close(&row);
        if (err) break;
        if (state == NULL) {
            if (!o->missing_done) {
                d->missing = o->ids[k];
                err = EMQ_ERR_COUNT_;
            } else {
                d->outcome[k] = emq_str.missing;
            }
        } else if (emq_str_equal(state, emq_str.done)) {
            d->outcome[k] = emq_str.done;
        } else if (emq_str_equal(state, emq_str.dead) || emq_str_equal(state, emq_str.cancelled)) {
            d->outcome[k] = emq_str_equal(state, emq_str.dead) ? emq_str.dead : emq_str.cancelled;
            if (o->policy == EMQ_POLICY_FAIL && d->verdict != EMQ_DEPS_DIES) {
                d->verdict = EMQ_DEPS_DIES;
                d->reason = death_reason(ctx, o->ids[k], d->outcome[k]);
            }
        } else {
            d->live++;
            d->names[k] = emq_derived_key(ctx, base, "waiters:", o->ids[k]);
            err = emq_open_derived(ctx, user, &d->waiters[k], d->names[k], EMQ_DERIVED_LANE);
            if (!err && !emq_type_ok(&d->waiters[k], REDISMODULE_KEYTYPE_ZSET)) err = EMQ_ERR_WRONGTYPE;
        }
        if (state) RedisModule_FreeString(NULL, state);
    }
    if (err) return err;
    if (d->verdict == EMQ_DEPS_DIES) {
        d->dead_name = emq_derived_key(ctx, base, "dead", NULL);
        err = emq_open_derived(ctx, user, &d->dead, d->dead_name, EMQ_DERIVED_LANE);
        if (!err && !emq_type_ok(&d->dead, REDISMODULE_KEYTYPE_ZSET)) err = EMQ_ERR_WRONGTYPE;
        return err;
    }
    if (d->live > 0) d->verdict = EMQ_DEPS_WAIT;
    d->deps_name = emq_derived_key(ctx, base, "deps:", id);
    err = emq_open_derived(ctx, user, &d->deps, d->deps_name, EMQ_DERIVED_READ_WRITE);
    if (!err && !emq_type_ok(&d->deps, REDISMODULE_KEYTYPE_HASH)) err = EMQ_ERR_WRONGTYPE;
    return err;
}

int emq_deps_reply_error(RedisModuleCtx *ctx, EmqDeps *d, int err) {
    if (err != EMQ_ERR_COUNT_ || d->missing == NULL) return emq_reply_error(ctx, err);
    size_t len;
    const char *s = RedisModule_StringPtrLen(d->missing, &len);
    /* An error line cannot carry a control byte (a NUL would cut it, CR LF
     * end it): each is shown as '?'. */
    char *buf = RedisModule_Alloc(len + 40);
    memcpy(buf, "ERR dependency ", 15);
    for (size_t i = 0; i < len; i++) {
        unsigned char c = (unsigned char)s[i];
        buf[15 + i] = c < 0x20 || c == 0x7f ? '?' : (char)c;
    }
    memcpy(buf + 15 + len, " does not exist", 16);
    RedisModule_ReplyWithError(ctx, buf);
    RedisModule_Free(buf);
    return REDISMODULE_OK;
}

int emq_deps_row_fields(EmqDeps *d, EmqFx *fx, long long now, long long due, int delayed,
                        RedisModuleString **fields, RedisModuleString **values, RedisModuleString **state) {
    int n = 0;
    *state = emq_str.pending;
    if (d->verdict == EMQ_DEPS_NONE) return 0;
    fields[n] = emq_str.after, values[n++] = emq_fx_number(fx, d->opts->n);
    if (d->verdict == EMQ_DEPS_DIES) {
        *state = emq_str.dead;
        fields[n] = emq_str.finished_at, values[n++] = emq_fx_number(fx, now);
        fields[n] = emq_str.last_error, values[n++] = d->reason;
        return n;
    }
    if (d->verdict != EMQ_DEPS_WAIT) return n;
    *state = emq_str.waiting;
    fields[n] = emq_str.waits, values[n++] = emq_fx_number(fx, d->live);
    if (delayed) fields[n] = emq_str.due, values[n++] = emq_fx_number(fx, due);
    if (d->opts->policy != EMQ_POLICY_FAIL)
        fields[n] = emq_str.on_failure,
        values[n++] = emq_fx_own(fx, RedisModule_CreateString(NULL, policy_name(d->opts->policy),
                                                              strlen(policy_name(d->opts->policy))));
    return n;
}

/* Mark a dependency's row `waiters` 1: its end looks for the waiter set only
 * then (a job without waiters pays one field read at its end). */
static void mark_waited(RedisModuleCtx *ctx, EmqFx *fx, RedisModuleString *base, RedisModuleString *dep) {
    RedisModuleString *name = emq_derived_key(ctx, base, "job:", dep);
    EmqKey row;
    emq_key_open(ctx, &row, name, REDISMODULE_READ | REDISMODULE_WRITE);
    if (!emq_hexists(&row, emq_str.waiters)) emq_fx_hset(fx, &row, "hset", 1, emq_str.waiters, emq_str.one);
    emq_key_close(&row);
    RedisModule_FreeString(ctx, name);
}

void emq_deps_apply(EmqDeps *d, EmqFx *fx, RedisModuleString *base, RedisModuleString *id, long long now) {
    if (d->verdict == EMQ_DEPS_NONE) return;
    if (!emq_hexists(&d->meta, emq_str.deps)) emq_fx_hset(fx, &d->meta, "hset", 1, emq_str.deps, emq_str.one);
    if (d->verdict == EMQ_DEPS_DIES) {
        emq_fx_zadd(fx, &d->dead, now, id, 0);
        return;
    }
    int n = d->opts->n;
    RedisModuleString **fields = RedisModule_Alloc((size_t)n * sizeof *fields);
    RedisModuleString **values = RedisModule_Alloc((size_t)n * sizeof *values);
    for (int k = 0; k < n; k++) {
        fields[k] = d->opts->ids[k];
        values[k] = d->outcome[k] ? d->outcome[k] : emq_str.waiting;
    }
    emq_fx_hset_argv(fx, &d->deps, "hset", n, fields, values);
    RedisModule_Free(fields);
    RedisModule_Free(values);
    for (int k = 0; k < n; k++) {
        if (d->outcome[k]) continue;
        emq_fx_zadd(fx, &d->waiters[k], now, id, 0);
        mark_waited(d->ctx, fx, base, d->opts->ids[k]);
    }
}

void emq_deps_close(EmqDeps *d) {
    int n = d->outcome ? d->opts->n : 0;
    for (int k = 0; k < n; k++) {
        emq_key_close(&d->waiters[k]);
        if (d->names[k]) RedisModule_FreeString(d->ctx, d->names[k]);
    }
    RedisModule_Free(d->outcome);
    RedisModule_Free(d->waiters);
    RedisModule_Free(d->names);
    emq_key_close(&d->deps);
    emq_key_close(&d->dead);
    emq_key_close(&d->meta);
    if (d->meta_name) RedisModule_FreeString(d->ctx, d->meta_name);
    if (d->deps_name) RedisModule_FreeString(d->ctx, d->deps_name);
    if (d->dead_name) RedisModule_FreeString(d->ctx, d->dead_name);
    if (d->reason) RedisModule_FreeString(d->ctx, d->reason);
    d->outcome = NULL;
}

/* -- a job's end ---------------------------------------------------------- */

typedef struct {
    RedisModuleString *id;      /* borrowed */
    RedisModuleString **leave;  /* waiter sets to leave (owned names) */
    int nleave;
    RedisModuleString *deps;    /* its deps hash to delete (owned), or NULL */
    int push;                   /* it has waiters: push `<how>:<id>` */
    int applied;
} EndItem;

struct EmqDepsEnd {
    RedisModuleUser *user;
    int user_loaded;
    EndItem *items;
    size_t n, cap, cursor;
    int pushed;
};

static int draining; /* inside emq_deps_drain: its own loop resolves what ends there */

static EmqDepsEnd *end_state(EmqEnd *e) {
    if (e->deps == NULL) {
        e->deps = RedisModule_Alloc(sizeof *e->deps);
        memset(e->deps, 0, sizeof *e->deps);
    }
    return e->deps;
}

/* The dependencies a deps hash still waits for (HGETALL: at most
 * EMQ_DEPS_MAX fields), as waiter-set names. */
static int waited_for(RedisModuleCtx *ctx, RedisModuleString *base, RedisModuleString *deps_name,
                      RedisModuleString ***names) {
    RedisModuleCallReply *r = RedisModule_Call(ctx, "HGETALL", "s", deps_name);
    *names = NULL;
    int n = 0;
    if (r == NULL) return 0;
    size_t len = RedisModule_CallReplyLength(r);
    if (len > 0) *names = RedisModule_Alloc((len / 2 + 1) * sizeof **names);
    for (size_t i = 0; i + 1 < len; i += 2) {
        size_t vl;
        const char *v = RedisModule_CallReplyStringPtr(RedisModule_CallReplyArrayElement(r, i + 1), &vl);
        if (v == NULL || vl != 7 || memcmp(v, "waiting", 7) != 0) continue;
        RedisModuleString *dep = RedisModule_CreateStringFromCallReply(RedisModule_CallReplyArrayElement(r, i));
        (*names)[n++] = emq_derived_key(ctx, base, "waiters:", dep);
        RedisModule_FreeString(NULL, dep);
    }
    RedisModule_FreeCallReply(r);
    return n;
}

int emq_deps_end_prepare(EmqEnd *e, RedisModuleString *id, int how, int already, int has_deps, int has_waiters) {
    (void)how;
    if (already) return EMQ_OK; /* settled when it ended */
    RedisModuleCtx *ctx = e->ctx;
    for (size_t i = 0; e->deps && i < e->deps->n; i++) /* named twice in one call: once */
        if (!e->deps->items[i].applied && emq_str_equal(e->deps->items[i].id, id)) return EMQ_OK;
    if (!has_deps && !has_waiters) return EMQ_OK;

    EmqDepsEnd *s = end_state(e);
    if (!s->user_loaded) {
        s->user_loaded = 1;
        if (!emq_acl_user(ctx, &s->user)) return EMQ_ERR_NOPERM_DERIVED;
    }
    EndItem it = {.id = id};
    int err = EMQ_OK;
    if (has_deps) {
        RedisModuleString *deps_name = emq_derived_key(ctx, e->base, "deps:", id);
        EmqKey k = {0};
        err = emq_open_derived(ctx, s->user, &k, deps_name, EMQ_DERIVED_READ_DELETE);
        if (!err && !emq_type_ok(&k, REDISMODULE_KEYTYPE_HASH)) err = EMQ_ERR_WRONGTYPE;
        int exists = !err && !emq_key_empty(&k);
        emq_key_close(&k);
        if (exists) {
            it.deps = deps_name;
            it.nleave = waited_for(ctx, e->base, deps_name, &it.leave);
            for (int i = 0; i < it.nleave && !err; i++) {
                EmqKey w = {0};
                err = emq_open_derived(ctx, s->user, &w, it.leave[i], EMQ_DERIVED_LANE);
                if (!err && !emq_type_ok(&w, REDISMODULE_KEYTYPE_ZSET)) err = EMQ_ERR_WRONGTYPE;
                emq_key_close(&w);
            }
        } else {
            RedisModule_FreeString(ctx, deps_name);
        }
    }
    if (!err && has_waiters) {
        RedisModuleString *wname = emq_derived_key(ctx, e->base, "waiters:", id);
        EmqKey w = {0};
        err = emq_open_derived(ctx, s->user, &w, wname, EMQ_DERIVED_READ);
        it.push = !err && !emq_key_empty(&w);
        emq_key_close(&w);
        RedisModule_FreeString(ctx, wname);
        if (!err && it.push) {
            RedisModuleString *rname = emq_derived_key(ctx, e->base, "resolve", NULL);
            EmqKey r = {0};
            err = emq_open_derived(ctx, s->user, &r, rname, EMQ_DERIVED_READ_WRITE);
            if (!err && !emq_type_ok(&r, REDISMODULE_KEYTYPE_LIST)) err = EMQ_ERR_WRONGTYPE;
            emq_key_close(&r);
            RedisModule_FreeString(ctx, rname);
        }
    }
    if (s->n == s->cap) {
        s->cap = s->cap ? 2 * s->cap : 4;
        s->items = RedisModule_Realloc(s->items, s->cap * sizeof *s->items);
    }
    s->items[s->n++] = it;
    return err;
}

static RedisModuleString *how_name(int how) {
    return how == EMQ_END_DONE ? emq_str.done
           : how == EMQ_END_DEAD ? emq_str.dead
           : how == EMQ_END_CANCELLED ? emq_str.cancelled
                                      : emq_str.deleted;
}

void emq_deps_end_apply(EmqEnd *e, EmqFx *fx, RedisModuleString *id, int how, int already) {
    EmqDepsEnd *s = e->deps;
    if (already || s == NULL || s->n == 0) return;
    RedisModuleCtx *ctx = e->ctx;
    size_t i = s->cursor;
    for (size_t tried = 0; tried < s->n; tried++, i = (i + 1) % s->n) {
        EndItem *it = &s->items[i];
        if (it->applied || !emq_str_equal(it->id, id)) continue;
        it->applied = 1;
        s->cursor = (i + 1) % s->n;
        for (int k = 0; k < it->nleave; k++) {
            EmqKey w;
            emq_key_open(ctx, &w, it->leave[k], REDISMODULE_READ | REDISMODULE_WRITE);
            emq_fx_zrem(fx, &w, id);
            emq_key_close(&w);
        }
        if (it->deps) {
            EmqKey k;
            emq_key_open(ctx, &k, it->deps, REDISMODULE_READ | REDISMODULE_WRITE);
            emq_fx_del(fx, &k);
            emq_key_close(&k);
        }
        if (it->push) {
            size_t il, hl;
            const char *ip = RedisModule_StringPtrLen(id, &il);
            const char *hp = RedisModule_StringPtrLen(how_name(how), &hl);
            char *buf = RedisModule_Alloc(hl + 1 + il);
            memcpy(buf, hp, hl);
            buf[hl] = ':';
            memcpy(buf + hl + 1, ip, il);
            RedisModuleString *entry = RedisModule_CreateString(ctx, buf, hl + 1 + il);
            RedisModule_Free(buf);
            RedisModuleString *rname = emq_derived_key(ctx, e->base, "resolve", NULL);
            EmqKey r;
            emq_key_open(ctx, &r, rname, REDISMODULE_READ | REDISMODULE_WRITE);
            emq_fx_push(fx, &r, 0, &entry, 1);
            emq_key_close(&r);
            RedisModule_FreeString(ctx, rname);
            RedisModule_FreeString(ctx, entry);
            s->pushed = 1;
        }
        return;
    }
}

void emq_deps_end_close(EmqEnd *e) {
    EmqDepsEnd *s = e->deps;
    if (s == NULL) return;
    int pushed = s->pushed;
    for (size_t i = 0; i < s->n; i++) {
        for (int k = 0; k < s->items[i].nleave; k++) RedisModule_FreeString(e->ctx, s->items[i].leave[k]);
        RedisModule_Free(s->items[i].leave);
        if (s->items[i].deps) RedisModule_FreeString(e->ctx, s->items[i].deps);
    }
    RedisModule_Free(s->items);
    if (s->user) RedisModule_FreeModuleUser(s->user);
    RedisModule_Free(s);
    e->deps = NULL;
    if (pushed && !draining) emq_deps_drain(e->ctx, e->base, EMQ_DEPS_STEP);
}

/* -- the resolver --------------------------------------------------------- */

static int open_checked(RedisModuleCtx *ctx, RedisModuleUser *user, EmqKey *k, RedisModuleString *name, int access,
                        int type) {
    int err = emq_open_derived(ctx, user, k, name, access);
    if (!err && !emq_type_ok(k, type)) err = EMQ_ERR_WRONGTYPE;
    return err;
}

static long long field_ll(EmqKey *row, RedisModuleString *field, long long fallback, int *bad) {
    RedisModuleString *v = emq_hget(row, field);
    if (v == NULL) return fallback;
    long long n;
    size_t len;
    const char *s = RedisModule_StringPtrLen(v, &len);
    if (emq_parse_ll(s, len, &n) != 0) *bad = 1;
    RedisModule_FreeString(NULL, v);
    return n;
}

/* The waiter `w` learns that `dep` ended `how`: one atomic step (checks,
 * then writes).  EMQ_OK, or the error that stops the drain (nothing of this
 * waiter written). */
static int resolve_one(RedisModuleCtx *ctx, RedisModuleUser *user, RedisModuleString *base, EmqFx *fx,
                       RedisModuleString *w, RedisModuleString *dep, RedisModuleString *how, long long now) {
    RedisModuleString *row_name = emq_derived_key(ctx, base, "job:", w);
    RedisModuleString *deps_name = emq_derived_key(ctx, base, "deps:", w);
    RedisModuleString *set_name = emq_derived_key(ctx, base, "waiters:", dep);
    RedisModuleString *pending_name = emq_derived_key(ctx, base, "pending", NULL);
    RedisModuleString *dead_name = emq_derived_key(ctx, base, "dead", NULL);
    EmqKey row = {0}, deps = {0}, set = {0}, pending = {0}, dead = {0};
    EmqLanes lanes;
    int lanes_open = 0, signal = 0;
    long long due = now;
    int err = open_checked(ctx, user, &row, row_name, EMQ_DERIVED_READ_WRITE, REDISMODULE_KEYTYPE_HASH);
    if (!err) err = open_checked(ctx, user, &deps, deps_name, EMQ_DERIVED_READ_WRITE, REDISMODULE_KEYTYPE_HASH);
    if (!err) err = open_checked(ctx, user, &set, set_name, EMQ_DERIVED_LANE, REDISMODULE_KEYTYPE_ZSET);
    if (err) goto done;
    RedisModuleString *state = emq_hget(&row, emq_str.state), *mine = emq_hget(&deps, dep);
    int live = state && emq_str_equal(state, emq_str.waiting) && mine && emq_str_equal(mine, emq_str.waiting);
    if (state) RedisModule_FreeString(NULL, state);
    if (mine) RedisModule_FreeString(NULL, mine);
    if (!live) { /* not waiting on it (any more): only the set entry goes */
        emq_fx_zrem(fx, &set, w);
        goto done;
    }
    int bad = 0;
    long long waits = field_ll(&row, emq_str.waits, 1, &bad);
    if (bad || waits < 1 || waits > EMQ_DEPS_MAX) {
        err = EMQ_ERR_AFTER_FIELD;
        goto done;
    }
    RedisModuleString *pv = emq_hget(&row, emq_str.on_failure);
    int policy = parse_policy(pv);
    if (pv) RedisModule_FreeString(NULL, pv);

    if (failed_how(how) && policy == EMQ_POLICY_FAIL) {
        /* It ends dead: its own end runs the hook (its waiters, its unique
         * key, its announcement), after the handles the hook writes through
         * are closed here. */
        emq_key_close(&deps);
        emq_key_close(&set);
        err = open_checked(ctx, user, &dead, dead_name, EMQ_DERIVED_LANE, REDISMODULE_KEYTYPE_ZSET);
        EmqEnd sub;
        emq_end_init(&sub, ctx, base);
        if (!err) err = emq_ended_prepare(&sub, w, EMQ_END_DEAD, 0);
        if (!err) {
            RedisModuleString *reason = death_reason(ctx, dep, how);
            emq_fx_hset(fx, &row, "hset", 3, emq_str.state, emq_str.dead, emq_str.finished_at,
                        emq_fx_number(fx, now), emq_str.last_error, emq_fx_own(fx, reason));
            emq_fx_hdel(fx, &row, emq_str.waits);
            emq_fx_hdel(fx, &row, emq_str.due);
            emq_fx_hdel(fx, &row, emq_str.on_failure);
            emq_fx_zadd(fx, &dead, now, w, 0);
            emq_ended_apply(&sub, fx, w, EMQ_END_DEAD, 0);
        }
        emq_end_close(&sub);
        goto done;
    }

    if (waits == 1) {
        due = field_ll(&row, emq_str.due, now, &bad);
        if (bad) {
            err = EMQ_ERR_AFTER_FIELD;
            goto done;
        }
        err = open_checked(ctx, user, &pending, pending_name, EMQ_DERIVED_READ_WRITE, REDISMODULE_KEYTYPE_LIST);
        if (!err) {
            emq_lanes_init(&lanes, ctx, user, base, &pending);
            lanes_open = 1;
            err = emq_lanes_enter_row(&lanes, w, &row, due, now);
        }
        if (err) goto done;
    }
    emq_fx_hset(fx, &deps, "hset", 1, dep, how);
    emq_fx_zrem(fx, &set, w);
    if (waits > 1) {
        emq_fx_hset(fx, &row, "hset", 1, emq_str.waits, emq_fx_number(fx, waits - 1));
    } else {
        emq_fx_hset(fx, &row, "hset", 1, emq_str.state, emq_str.pending);
        emq_fx_hdel(fx, &row, emq_str.waits);
        emq_fx_hdel(fx, &row, emq_str.due);
        emq_fx_hdel(fx, &row, emq_str.on_failure);
        emq_lanes_apply(&lanes, fx);
        signal = 1;
    }

done:
    if (lanes_open) emq_lanes_close(&lanes);
    emq_key_close(&row);
    emq_key_close(&deps);
    emq_key_close(&set);
    emq_key_close(&pending);
    emq_key_close(&dead);
    if (signal) emq_signal_due(ctx, pending_name, due, now);
    RedisModule_FreeString(ctx, row_name);
    RedisModule_FreeString(ctx, deps_name);
    RedisModule_FreeString(ctx, set_name);
    RedisModule_FreeString(ctx, pending_name);
    RedisModule_FreeString(ctx, dead_name);
    return err;
}

/* The head of <base>resolve (a new string), or NULL. */
static RedisModuleString *resolve_head(RedisModuleCtx *ctx, RedisModuleString *name) {
    RedisModuleCallReply *r = RedisModule_Call(ctx, "LINDEX", "sl", name, 0LL);
    if (r == NULL) return NULL;
    RedisModuleString *s = NULL;
    if (RedisModule_CallReplyType(r) == REDISMODULE_REPLY_STRING) s = RedisModule_CreateStringFromCallReply(r);
    RedisModule_FreeCallReply(r);
    return s;
}

static void resolve_pop(RedisModuleCtx *ctx, EmqFx *fx, RedisModuleString *name) {
    EmqKey k;
    emq_key_open(ctx, &k, name, REDISMODULE_READ | REDISMODULE_WRITE);
    emq_fx_lpop(fx, &k, 1);
    emq_key_close(&k);
}

void emq_deps_drain(RedisModuleCtx *ctx, RedisModuleString *base, long budget) {
    if (draining || budget < 1) return;
    RedisModuleString *rname = emq_derived_key(ctx, base, "resolve", NULL);
    EmqKey r = {0};
    /* The common case, nothing to resolve, costs one lookup (and no ACL
     * check: nothing is read from the key, nor written, when it is empty). */
    emq_key_open(ctx, &r, rname, REDISMODULE_READ);
    int none = emq_key_empty(&r);
    emq_key_close(&r);
    RedisModuleUser *user = NULL;
    if (none || !emq_acl_user(ctx, &user)) {
        RedisModule_FreeString(ctx, rname);
        return;
    }
    int err = open_checked(ctx, user, &r, rname, EMQ_DERIVED_READ_WRITE, REDISMODULE_KEYTYPE_LIST);
    int empty = emq_key_empty(&r);
    emq_key_close(&r);
    if (err || empty) goto out;
    draining = 1;
    long long now = RedisModule_Milliseconds();
    EmqFx fx;
    emq_fx_begin(&fx, ctx);
    while (budget > 0 && !err) {
        RedisModuleString *entry = resolve_head(ctx, rname);
        if (entry == NULL) break;
        size_t len;
        const char *s = RedisModule_StringPtrLen(entry, &len);
        const char *colon = memchr(s, ':', len);
        if (colon == NULL || colon + 1 == s + len) { /* not ours: dropped */
            resolve_pop(ctx, &fx, rname);
            RedisModule_FreeString(NULL, entry);
            continue;
        }
        RedisModuleString *how = RedisModule_CreateString(ctx, s, (size_t)(colon - s));
        RedisModuleString *dep = RedisModule_CreateString(ctx, colon + 1, len - (size_t)(colon - s) - 1);
        RedisModule_FreeString(NULL, entry);
        RedisModuleString *set_name = emq_derived_key(ctx, base, "waiters:", dep);
        EmqKey set = {0};
        err = open_checked(ctx, user, &set, set_name, EMQ_DERIVED_LANE, REDISMODULE_KEYTYPE_ZSET);
        RedisModuleString **ids = NULL;
        size_t n = err ? 0 : emq_zset_head(&set, HUGE_VAL, budget, &ids);
        emq_key_close(&set);
        size_t i = 0;
        for (; i < n && !err; i++) err = resolve_one(ctx, user, base, &fx, ids[i], dep, how, now);
        budget -= (long)i;
        for (size_t k = 0; k < n; k++) RedisModule_FreeString(NULL, ids[k]);
        RedisModule_Free(ids);
        if (!err) {
            emq_key_open(ctx, &set, set_name, REDISMODULE_READ);
            int done = emq_key_empty(&set);
            emq_key_close(&set);
            if (done) resolve_pop(ctx, &fx, rname);
            else if (n == 0) err = 1; /* no progress possible */
        }
        RedisModule_FreeString(ctx, set_name);
        RedisModule_FreeString(ctx, how);
        RedisModule_FreeString(ctx, dep);
    }
    emq_fx_commit(&fx);
    draining = 0;
out:
    RedisModule_FreeString(ctx, rname);
    if (user) RedisModule_FreeModuleUser(user);
}
