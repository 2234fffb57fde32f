/* emq_dead.c -- the operator and the dead letters: EMQ.RETRY, EMQ.RETRYDEAD,
 * EMQ.PURGE.
 *
 * A dead job waits in <dead>, scored with the time it died, with its row:
 * its payload, its last error, its history.  An operator decides what
 * becomes of it.  RETRY sends it (or a cancelled job) back to the tail of
 * its lane with a fresh budget; PURGE deletes it.
 *
 * The budget is the row's `tries`, which a retry resets; the fencing token
 * is not touched.  `attempts` keeps counting every claim of the job's whole
 * life and the next claim's token continues from it with a fresh random
 * part, so a holder from before the retry stays stale for good: its token
 * is neither the row's current one after the next claim, nor an active
 * job's before it, and the retry deletes `closed_by`, so no verb mistakes
 * that holder's call for the retry of its own lost reply.
 *
 * The bulk verbs take the oldest dead first, at most <limit> per call, and
 * only those that died at or before UNTIL when it is given: a caller that
 * loops until a batch comes back short, with UNTIL = the server time when
 * it started, ends even while jobs keep dying (they die later than that). */
#include <math.h>
#include <string.h>

#include "emq.h"

static const char *const DEAD_PENDING[] = {"dead", "pending"};
static const char *const DEAD_ONLY[] = {"dead"};

/* May the row be retried?  Its state must be dead or cancelled (EMQ_OK),
 * else the EMQSTATE error naming it. */
static int retry_state(EmqKey *row) {
    RedisModuleString *state = emq_hget(row, emq_str.state);
    size_t len = 0;
    const char *s = state ? RedisModule_StringPtrLen(state, &len) : NULL;
    int err = emq_retry_check(s, len);
    if (state) RedisModule_FreeString(NULL, state);
    return err;
}

/* The row's `retries` after this retry (HINCRBY's refusals). */
static int next_retries(EmqKey *row, long long *retries) {
    return emq_hash_incr(row, emq_str.retries, 1, EMQ_ERR_RETRIES_NOT_INTEGER, retries);
}

/* The retry itself, in the order of the core commands it stands for:
 * ZREM <dead>; HSET state pending tries 0 stalled 0; HINCRBY retries;
 * HDEL cancel_requested closed_by finished_at; PERSIST (a cancelled row
 * was expiring).  The job enters its lane's tail with the caller's
 * emq_lanes_apply (one RPUSH or ZADD for a whole batch). */
static void retry_apply(EmqFx *fx, EmqKey *dead, EmqKey *row, RedisModuleString *id, long long retries) {
    RedisModuleString *zero = emq_small_int[0];
    emq_fx_zrem(fx, dead, id);
    emq_fx_hset(fx, row, "hset", 3, emq_str.state, emq_str.pending, emq_str.tries, zero, emq_str.stalled, zero);
    emq_fx_hset(fx, row, "hincrby", 1, emq_str.retries, emq_fx_number(fx, retries));
    emq_fx_hdel(fx, row, emq_str.cancel_requested);
    emq_fx_hdel(fx, row, emq_str.closed_by);
    emq_fx_hdel(fx, row, emq_str.finished_at);
    emq_fx_persist(fx, row);
}

/* The lane a retried job enters: its level, the tail. */
static int retry_place(EmqLanes *lanes, EmqKey *row, RedisModuleString *id) {
    return emq_lanes_place_row(lanes, id, row, EMQ_AT_TAIL);
}

/* [UNTIL <ms>] from argv[first] on; *until stays +inf without it. */
static int parse_until(RedisModuleString **argv, int first, int argc, double *until) {
    int seen = 0;
    for (int i = first; i < argc; i += 2) {
        size_t len, vlen;
        const char *opt = RedisModule_StringPtrLen(argv[i], &len);
        if (i + 1 >= argc || seen || !emq_option_is(opt, len, "UNTIL")) return EMQ_ERR_SYNTAX;
        const char *v = RedisModule_StringPtrLen(argv[i + 1], &vlen);
        long long ms;
        int err = emq_parse_until(v, vlen, &ms);
        if (err) return err;
        *until = (double)ms;
        seen = 1;
    }
    return EMQ_OK;
}

/* ------------------------------------------------------------------------
 * EMQ.RETRY <dead> <pending> <base> <id>
 *
 * +pending  the dead or cancelled job waits at the tail of its lane again
 *           (behind the work already waiting) with a fresh
 *           budget: tries=0 stalled=0, retries+1; cancel_requested,
 *           closed_by and finished_at are gone and the row expires no more.
 * :-1       no such row.
 * -EMQSTATE the job is pending, active, done or in no known state.
 * ------------------------------------------------------------------------ */
int EmqRetry_RedisCommand(RedisModuleCtx *ctx, RedisModuleString **argv, int argc) {
    /* parse */
    if (argc != 5) return RedisModule_WrongArity(ctx);
    int err = emq_check_queue(ctx, &argv[1], DEAD_PENDING, 2, argv[3], EMQ_ERR_DEAD_PENDING_KEYS);
    if (err) return emq_reply_error(ctx, err);
    RedisModuleString *id = argv[4];

    /* open and type-check: the derived row's ACL before it is read */
    const int rw = REDISMODULE_READ | REDISMODULE_WRITE;
    RedisModuleUser *user = NULL;
    EmqKey dead, pending, row = {0};
    emq_key_open(ctx, &dead, argv[1], rw);
    emq_key_open(ctx, &pending, argv[2], rw);
    RedisModuleString *row_name = emq_derived_key(ctx, argv[3], "job:", id);
    EmqFx fx;
    emq_fx_begin(&fx, ctx);
    EmqLanes lanes;
    emq_lanes_init(&lanes, ctx, NULL, argv[3], &pending);
    int gone = 0;
    if (!emq_type_ok(&dead, REDISMODULE_KEYTYPE_ZSET) || !emq_type_ok(&pending, REDISMODULE_KEYTYPE_LIST))
        err = EMQ_ERR_WRONGTYPE;
    else err = emq_open_row(ctx, &user, &row, row_name);
    if (err) goto reply;

    /* read and decide */
    gone = emq_key_empty(&row);
    long long retries = 0;
    lanes.user = user;
    if (!gone) err = retry_state(&row);
    if (!gone && !err) err = next_retries(&row, &retries);
    if (!gone && !err) err = retry_place(&lanes, &row, id);
    if (gone || err) goto reply;

    /* apply */
    retry_apply(&fx, &dead, &row, id, retries);
    emq_lanes_apply(&lanes, &fx);

reply:
    if (err) emq_reply_error(ctx, err);
    else if (gone) RedisModule_ReplyWithLongLong(ctx, -1);
    else RedisModule_ReplyWithSimpleString(ctx, "pending");
    emq_fx_commit(&fx);
    int requeued = pending.modified || lanes.priority.modified;
    emq_lanes_close(&lanes);
    emq_key_close(&row);
    RedisModule_FreeString(ctx, row_name);
    emq_key_close(&pending);
    if (requeued) emq_signal_claimable(ctx, argv[2]); /* claims waiting on the queue */
    emq_key_close(&dead);
    if (user) RedisModule_FreeModuleUser(user);
    return REDISMODULE_OK;
}

/* One member of <dead> a bulk verb takes, and what becomes of it. */
typedef struct {
    RedisModuleString *id, *row_name;
    EmqKey row;
    int act; /* RETRYDEAD: retry it (else it only leaves <dead>); PURGE: delete its row */
    long long retries;
} DeadMember;

typedef struct {
    RedisModuleCtx *ctx;
    RedisModuleUser *user;
    DeadMember *m;
    size_t n;
} DeadBatch;

/* Take the batch's members and open their rows for `access` (each row's
 * ACL before it is read: RETRYDEAD changes them, PURGE deletes them).
 * EMQ_OK or the error; the batch is released either way by batch_release. */
static int batch_open(DeadBatch *b, EmqKey *dead, RedisModuleString *base, double until, long long limit,
                      int access) {
    RedisModuleString **ids;
    b->n = emq_zset_head(dead, until, limit, &ids);
    b->m = b->n ? RedisModule_Alloc(b->n * sizeof *b->m) : NULL;
    for (size_t i = 0; i < b->n; i++) {
        memset(&b->m[i], 0, sizeof b->m[i]);
        b->m[i].id = ids[i];
        b->m[i].row_name = emq_derived_key(b->ctx, base, "job:", ids[i]);
    }
    if (ids) RedisModule_Free(ids);
    for (size_t i = 0; i < b->n; i++) {
        DeadMember *d = &b->m[i];
        int err = emq_open_derived(b->ctx, b->user, &d->row, d->row_name, access);
        if (!err && !emq_type_ok(&d->row, REDISMODULE_KEYTYPE_HASH)) err = EMQ_ERR_WRONGTYPE;
        if (err) return err;
    }
    return EMQ_OK;
}

static void batch_release(DeadBatch *b) {
    for (size_t i = 0; i < b->n; i++) {
        emq_key_close(&b->m[i].row);
        RedisModule_FreeString(b->ctx, b->m[i].row_name);
        RedisModule_FreeString(b->ctx, b->m[i].id);
    }
    if (b->m) RedisModule_Free(b->m);
    if (b->user) RedisModule_FreeModuleUser(b->user);
}

/* ------------------------------------------------------------------------
 * EMQ.RETRYDEAD <dead> <pending> <base> <limit> [UNTIL <ms>]
 *
 * RETRY for the <limit> oldest members of <dead> (those that died at or
 * before UNTIL when it is given).  Reply [retried, dropped]: dropped
 * members left <dead> without a retry because their row is gone or is not
 * dead or cancelled (<dead> was wrong about them; such a row is not
 * touched).  Every row is checked before the first write: the batch is
 * applied whole or not at all.
 * ------------------------------------------------------------------------ */
int EmqRetryDead_RedisCommand(RedisModuleCtx *ctx, RedisModuleString **argv, int argc) {
    /* parse */
    if (argc < 5) return RedisModule_WrongArity(ctx);
    double until = HUGE_VAL;
    long long limit = 0;
    size_t limit_len;
    const char *limit_arg = RedisModule_StringPtrLen(argv[4], &limit_len);
    int err = emq_parse_limit(limit_arg, limit_len, emq_config_max_limit(), &limit);
    if (!err) err = parse_until(argv, 5, argc, &until);
    if (!err) err = emq_check_queue(ctx, &argv[1], DEAD_PENDING, 2, argv[3], EMQ_ERR_DEAD_PENDING_KEYS);
    if (err) return emq_reply_error(ctx, err);

    /* open and type-check */
    const int rw = REDISMODULE_READ | REDISMODULE_WRITE;
    EmqKey dead, pending;
    emq_key_open(ctx, &dead, argv[1], rw);
    emq_key_open(ctx, &pending, argv[2], rw);
    DeadBatch b = {.ctx = ctx};
    EmqFx fx;
    emq_fx_begin(&fx, ctx);
    EmqLanes lanes;
    emq_lanes_init(&lanes, ctx, NULL, argv[3], &pending);
    if (!emq_type_ok(&dead, REDISMODULE_KEYTYPE_ZSET) || !emq_type_ok(&pending, REDISMODULE_KEYTYPE_LIST))
        err = EMQ_ERR_WRONGTYPE;
    else if (!emq_acl_user(ctx, &b.user))
        err = EMQ_ERR_NOPERM_DERIVED;
    else
        err = batch_open(&b, &dead, argv[3], until, limit, EMQ_DERIVED_READ_WRITE);

    /* read and decide */
    long long retried = 0;
    lanes.user = b.user;
    for (size_t i = 0; !err && i < b.n; i++) {
        DeadMember *d = &b.m[i];
        /* No row, or a row in another state: not a dead job, dropped from <dead>. */
        if (emq_key_empty(&d->row) || retry_state(&d->row) != EMQ_OK) continue;
        err = next_retries(&d->row, &d->retries);
        if (!err) err = retry_place(&lanes, &d->row, d->id);
        d->act = 1;
        retried++;
    }
    if (err) goto reply;

    /* apply: member by member, then the lanes (one RPUSH or ZADD for all) */
    for (size_t i = 0; i < b.n; i++) {
        DeadMember *d = &b.m[i];
        if (d->act) retry_apply(&fx, &dead, &d->row, d->id, d->retries);
        else emq_fx_zrem(&fx, &dead, d->id);
    }
    emq_lanes_apply(&lanes, &fx);

reply:
    if (err) {
        emq_reply_error(ctx, err);
    } else {
        RedisModule_ReplyWithArray(ctx, 2);
        RedisModule_ReplyWithLongLong(ctx, retried);
        RedisModule_ReplyWithLongLong(ctx, (long long)b.n - retried);
    }
    emq_fx_commit(&fx);
    int requeued = pending.modified || lanes.priority.modified;
    emq_lanes_close(&lanes);
    batch_release(&b);
    emq_key_close(&pending);
    if (requeued) emq_signal_claimable(ctx, argv[2]); /* claims waiting on the queue */
    emq_key_close(&dead);
    return REDISMODULE_OK;
}

/* ------------------------------------------------------------------------
 * EMQ.PURGE <dead> <base> <limit> [UNTIL <ms>]
 *
 * Deletes the <limit> oldest members of <dead> (those that died at or
 * before UNTIL when it is given) and their rows.  Reply :<n>, the members
 * removed.  A member whose row is in another state than dead leaves <dead>
 * but its row is kept (it is not the dead job's).
 * ------------------------------------------------------------------------ */
int EmqPurge_RedisCommand(RedisModuleCtx *ctx, RedisModuleString **argv, int argc) {
    /* parse */
    if (argc < 4) return RedisModule_WrongArity(ctx);
    double until = HUGE_VAL;
    long long limit = 0;
    size_t limit_len;
    const char *limit_arg = RedisModule_StringPtrLen(argv[3], &limit_len);
    int err = emq_parse_limit(limit_arg, limit_len, emq_config_max_limit(), &limit);
    if (!err) err = parse_until(argv, 4, argc, &until);
    if (!err) err = emq_check_queue(ctx, &argv[1], DEAD_ONLY, 1, argv[2], EMQ_ERR_DEAD_KEY);
    if (err) return emq_reply_error(ctx, err);

    /* open and type-check */
    EmqKey dead;
    emq_key_open(ctx, &dead, argv[1], REDISMODULE_READ | REDISMODULE_WRITE);
    EmqEnd end;
    emq_end_init(&end, ctx, argv[2]);
    DeadBatch b = {.ctx = ctx};
    EmqFx fx;
    emq_fx_begin(&fx, ctx);
    if (!emq_type_ok(&dead, REDISMODULE_KEYTYPE_ZSET)) err = EMQ_ERR_WRONGTYPE;
    else if (!emq_acl_user(ctx, &b.user)) err = EMQ_ERR_NOPERM_DERIVED;
    else err = batch_open(&b, &dead, argv[2], until, limit, EMQ_DERIVED_READ_DELETE);
    if (err) goto reply;

    /* read and decide */
    for (size_t i = 0; i < b.n; i++) {
        DeadMember *d = &b.m[i];
        RedisModuleString *state = emq_hget(&d->row, emq_str.state);
        size_t len = 0;
        const char *s = state ? RedisModule_StringPtrLen(state, &len) : NULL;
        d->act = emq_purge_deletes_row(!emq_key_empty(&d->row), s, len);
        if (state) RedisModule_FreeString(NULL, state);
    }

    /* The rows deleted are of jobs that ended (dead): the `ended` hook's
     * deletion steps run (emq_end.h). */
    for (size_t i = 0; !err && i < b.n; i++)
        if (b.m[i].act) err = emq_ended_prepare(&end, b.m[i].id, EMQ_END_DELETED, 1);
    if (err) goto reply;

    /* apply: ZREM, then DEL, member by member */
    for (size_t i = 0; i < b.n; i++) {
        emq_fx_zrem(&fx, &dead, b.m[i].id);
        if (b.m[i].act) {
            emq_fx_del(&fx, &b.m[i].row);
            emq_ended_apply(&end, &fx, b.m[i].id, EMQ_END_DELETED, 1);
        }
    }

reply:
    if (err) emq_reply_error(ctx, err);
    else RedisModule_ReplyWithLongLong(ctx, (long long)b.n);
    emq_fx_commit(&fx);
    emq_end_close(&end);
    batch_release(&b);
    emq_key_close(&dead);
    return REDISMODULE_OK;
}
