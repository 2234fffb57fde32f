/* emq_flow.c -- flow control: EMQ.LIMIT, and the step every claim takes
 * through it (see emq_flow.h).
 *
 * Why a fixed window aligned to the server clock, not a sliding log or
 * GCRA: its guarantee is exact and checkable from outside -- at most <max>
 * jobs are handed out in each window [k * per, (k + 1) * per) of server
 * time -- and it costs two integers per queue, written with absolute values
 * (a replica and the AOF replay the very count), where a sliding log keeps
 * one entry per claim.  Its known cost: a burst of <max> at a window's end
 * and another at the next one's start, so any per-long interval sees at
 * most 2 * <max>.  GCRA smooths that, but does not bound a window by <max>
 * either (a full burst, then one every per / max).  A claim refused by the
 * limit writes nothing and answers null; a waiting claim is woken when the
 * next window opens (its due timer, emq_wake.c), never polled. */
#include <string.h>

#include "emq.h"

static const char *const PENDING_ONLY[] = {"pending"};

/* One field of the hash, checked to lie in [min, max] (absent: 0). */
static int read_field(EmqKey *k, RedisModuleString *field, long long min, long long max, long long *out) {
    RedisModuleString *v = emq_hget(k, field);
    size_t len = 0;
    const char *p = v ? RedisModule_StringPtrLen(v, &len) : NULL;
    int err = emq_parse_limit_field(p, len, v != NULL, min, max, out);
    if (v) RedisModule_FreeString(NULL, v);
    return err;
}

/* What <base>limit holds, every field checked: the rate's two fields come
 * together or not at all. */
static int read_rate(EmqKey *k, EmqRate *r) {
    memset(r, 0, sizeof *r);
    if (emq_key_empty(k)) return EMQ_OK;
    int err = read_field(k, emq_str.rate_max, 1, EMQ_RATE_MAX_MAX, &r->max);
    if (!err) err = read_field(k, emq_str.rate_per_ms, 1, EMQ_RATE_PER_MAX, &r->per);
    if (!err) err = read_field(k, emq_str.rate_window, 0, EMQ_MAX_EXACT_SCORE, &r->window);
    if (!err) err = read_field(k, emq_str.rate_used, 0, EMQ_MAX_EXACT_SCORE, &r->used);
    if (!err) err = read_field(k, emq_str.backoff_until, 0, EMQ_MAX_EXACT_SCORE, &r->until);
    if (!err && (r->max == 0) != (r->per == 0)) err = EMQ_ERR_LIMIT_FIELD;
    return err;
}

static int open_limit(EmqFlow *f, RedisModuleCtx *ctx, RedisModuleUser *user, RedisModuleString *base, int access) {
    memset(f, 0, sizeof *f);
    f->ctx = ctx;
    f->name = emq_derived_key(ctx, base, "limit", NULL);
    int err = emq_open_derived(ctx, user, &f->key, f->name, access);
    if (!err && !emq_type_ok(&f->key, REDISMODULE_KEYTYPE_HASH)) err = EMQ_ERR_WRONGTYPE;
    if (!err) err = read_rate(&f->key, &f->rate);
    return err;
}

int emq_flow_claim_prepare(EmqFlow *f, RedisModuleCtx *ctx, RedisModuleUser *user, RedisModuleString *base,
                           long long now, long long *allowance, long long *reopen) {
    int err = open_limit(f, ctx, user, base, EMQ_DERIVED_READ_WRITE);
    if (err) return err;
    EmqRate *r = &f->rate;
    *allowance = emq_rate_allowance(r->max, r->per, r->window, r->used, r->until, now, &f->used, reopen);
    if (f->rate.max) emq_rate_window(now, f->rate.per, &f->start);
    return EMQ_OK;
}

void emq_flow_claim_apply(EmqFlow *f, EmqFx *fx, long n) {
    if (f->rate.max == 0 || n <= 0) return;
    emq_fx_hset(fx, &f->key, "hset", 2, emq_str.rate_window, emq_fx_number(fx, f->start), emq_str.rate_used,
                emq_fx_number(fx, f->used + n));
}

int emq_flow_backoff_prepare(EmqFlow *f, RedisModuleCtx *ctx, RedisModuleUser *user, RedisModuleString *base,
                             long long now, long long ms) {
    int err = open_limit(f, ctx, user, base, EMQ_DERIVED_READ_WRITE);
    if (!err && ms > 0 && now + ms > f->rate.until) f->set_until = now + ms;
    return err;
}

void emq_flow_backoff_apply(EmqFlow *f, EmqFx *fx) {
    if (f->set_until > 0)
        emq_fx_hset(fx, &f->key, "hset", 1, emq_str.backoff_until, emq_fx_number(fx, f->set_until));
}

void emq_flow_close(EmqFlow *f) {
    emq_key_close(&f->key);
    if (f->name) RedisModule_FreeString(f->ctx, f->name);
    f->name = NULL;
}

/* ------------------------------------------------------------------------
 * EMQ.LIMIT <pending> <base> [RATE <max>] [PER <ms>] [OFF] [BACKOFF <ms>]
 *
 * RATE <max> PER <ms> (given together) sets the queue's rate: claims hand
 * out at most <max> jobs per window of <ms>, the windows aligned to the
 * server clock.  A new PER (or a first rate) restarts the count at the
 * current window; a new RATE alone keeps it.  OFF removes the rate.
 * BACKOFF <ms> stops every claim until server-now + <ms> (never brought
 * forward by a shorter one); BACKOFF 0 lifts it.  Without options it only
 * reads.  Reply, after the call: [max, per-ms, used, window-ends-at,
 * backoff-until] (0s where there is no rate; backoff-until 0 when none is
 * in force).  Claims waiting on the queue are woken when anything changed.
 * ------------------------------------------------------------------------ */
typedef struct {
    int rate, off, backoff;
    long long max, per, backoff_ms;
} LimitArgs;

static int parse_limit(RedisModuleString **argv, int argc, LimitArgs *a) {
    memset(a, 0, sizeof *a);
    int per = 0;
    for (int i = 3; i < argc; i++) {
        size_t len, vlen = 0;
        const char *opt = RedisModule_StringPtrLen(argv[i], &len);
        if (emq_option_is(opt, len, "OFF") && !a->off) {
            a->off = 1;
            continue;
        }
        if (i + 1 >= argc) return EMQ_ERR_SYNTAX;
        const char *v = RedisModule_StringPtrLen(argv[i + 1], &vlen);
        int err;
        if (emq_option_is(opt, len, "RATE") && !a->rate) {
            a->rate = 1;
            err = emq_parse_rate_max(v, vlen, &a->max);
        } else if (emq_option_is(opt, len, "PER") && !per) {
            per = 1;
            err = emq_parse_rate_per(v, vlen, &a->per);
        } else if (emq_option_is(opt, len, "BACKOFF") && !a->backoff) {
            a->backoff = 1;
            err = emq_parse_backoff(v, vlen, &a->backoff_ms);
        } else {
            return EMQ_ERR_SYNTAX;
        }
        if (err) return err;
        i++;
    }
    if (a->rate != per || (a->off && a->rate)) return EMQ_ERR_SYNTAX;
    return EMQ_OK;
}

int EmqLimit_RedisCommand(RedisModuleCtx *ctx, RedisModuleString **argv, int argc) {
    /* parse */
    if (argc < 3) return RedisModule_WrongArity(ctx);
    LimitArgs a;
    int err = parse_limit(argv, argc, &a);
    if (!err) err = emq_check_queue(ctx, &argv[1], PENDING_ONLY, 1, argv[2], EMQ_ERR_PENDING_KEY);
    if (err) return emq_reply_error(ctx, err);
    long long now = RedisModule_Milliseconds();
    int writes = a.rate || a.off || a.backoff;

    /* open, type-check and read */
    RedisModuleUser *user = NULL;
    EmqFlow f = {0};
    EmqRate *r = &f.rate;
    EmqFx fx;
    emq_fx_begin(&fx, ctx);
    int changed = 0;
    if (!emq_acl_user(ctx, &user)) err = EMQ_ERR_NOPERM_DERIVED;
    else err = open_limit(&f, ctx, user, argv[2], writes ? EMQ_DERIVED_READ_WRITE : EMQ_DERIVED_READ);
    if (err) goto reply;

    /* decide and apply: the rate's fields first, then the back-off */
    if (a.rate) {
        RedisModuleString *fields[4] = {emq_str.rate_max, emq_str.rate_per_ms, emq_str.rate_window,
                                        emq_str.rate_used};
        RedisModuleString *values[4];
        int n = 0;
        if (a.max != r->max) {
            fields[n] = emq_str.rate_max;
            values[n++] = emq_fx_number(&fx, a.max);
        }
        if (a.per != r->per) { /* a new window length: the count restarts in the current window */
            long long start;
            emq_rate_window(now, a.per, &start);
            fields[n] = emq_str.rate_per_ms;
            values[n++] = emq_fx_number(&fx, a.per);
            fields[n] = emq_str.rate_window;
            values[n++] = emq_fx_number(&fx, start);
            fields[n] = emq_str.rate_used;
            values[n++] = emq_fx_number(&fx, 0);
            r->window = start;
            r->used = 0;
        }
        if (n) emq_fx_hset_argv(&fx, &f.key, "hset", n, fields, values);
        changed |= n > 0;
        r->max = a.max;
        r->per = a.per;
    }
    if (a.off) {
        RedisModuleString *fields[4] = {emq_str.rate_max, emq_str.rate_per_ms, emq_str.rate_window,
                                        emq_str.rate_used};
        for (int i = 0; i < 4; i++) changed |= emq_fx_hdel(&fx, &f.key, fields[i]);
        r->max = r->per = r->window = r->used = 0;
    }
    if (a.backoff && a.backoff_ms == 0) {
        changed |= emq_fx_hdel(&fx, &f.key, emq_str.backoff_until);
        r->until = 0;
    } else if (a.backoff && now + a.backoff_ms > r->until) {
        r->until = now + a.backoff_ms;
        emq_fx_hset(&fx, &f.key, "hset", 1, emq_str.backoff_until, emq_fx_number(&fx, r->until));
        changed = 1;
    }

reply:
    if (err) {
        emq_reply_error(ctx, err);
    } else {
        long long used = 0, start = 0;
        if (r->max) {
            emq_rate_window(now, r->per, &start);
            used = r->window == start ? r->used : 0;
        }
        RedisModule_ReplyWithArray(ctx, 5);
        RedisModule_ReplyWithLongLong(ctx, r->max);
        RedisModule_ReplyWithLongLong(ctx, r->per);
        RedisModule_ReplyWithLongLong(ctx, used);
        RedisModule_ReplyWithLongLong(ctx, r->max ? start + r->per : 0);
        RedisModule_ReplyWithLongLong(ctx, r->until > now ? r->until : 0);
    }
    emq_fx_commit(&fx);
    emq_flow_close(&f);
    /* Claims waiting on the queue look again: a rate removed or raised, a
     * back-off lifted (one that only grew finds them refused again). */
    if (!err && changed) emq_signal_claimable(ctx, argv[1]);
    if (user) RedisModule_FreeModuleUser(user);
    return REDISMODULE_OK;
}
