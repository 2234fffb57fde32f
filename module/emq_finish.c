/* emq_finish.c -- a holder ends its hold: EMQ.COMPLETE, EMQ.FAIL, EMQ.RELEASE.
 *
 * Only the current holder may: the row's token must be the caller's and
 * the id must still be in <active> (a holder that lost its lease must not
 * finish a job someone else now owns).  A retry of the same call whose
 * reply was lost is recognised by the row's `closed_by` (the token still
 * matches, the job is no longer active, and this verb ended it): it answers
 * what the first call answered and writes nothing.
 *
 * A finished row is kept for the queue's retention (<base>meta: an hour
 * for done rows, a day for cancelled ones by default), then expires; a dead
 * row stays in <dead> until it is retried or purged (or SWEEP trims it past
 * the dead retention, when one is set). */
#include "emq.h"

static const char *const ACTIVE_PENDING_DEAD[] = {"active", "pending", "dead"};

/* The row of the job the holder names, and its own: see emq_lease.c. */
static int check_job_key(RedisModuleString *active, RedisModuleString *job, RedisModuleString *id) {
    size_t alen, jlen, idlen;
    const char *a = RedisModule_StringPtrLen(active, &alen), *j = RedisModule_StringPtrLen(job, &jlen);
    const char *i = RedisModule_StringPtrLen(id, &idlen);
    return emq_job_key_matches(a, alen, j, jlen, i, idlen) ? EMQ_OK : EMQ_ERR_JOB_KEY;
}

/* ------------------------------------------------------------------------
 * EMQ.COMPLETE <active> <job> <id> <token>
 *
 * :1 the job leaves <active>; its row gets state=done and finished_at, and
 * expires after the queue's done retention.  :-1 gone; -EMQSTALE wrong
 * token or no longer active (nothing written).
 *
 * Its steps are shared with EMQ.COMPLETECLAIM (emq_claim.c), which
 * completes and claims in one call: everything both check comes before
 * anything either writes.
 * ------------------------------------------------------------------------ */
int emq_complete_check(RedisModuleString *active, RedisModuleString *job, RedisModuleString *id) {
    if (emq_str_equal(active, job)) return EMQ_ERR_SAME_KEY;
    return check_job_key(active, job, id);
}

int emq_complete_prepare(RedisModuleCtx *ctx, EmqCompleting *c, RedisModuleString *active, RedisModuleString *job,
                         RedisModuleString *id, RedisModuleString *token) {
    /* open and type-check */
    const int rw = REDISMODULE_READ | REDISMODULE_WRITE;
    c->user = NULL;
    c->reply = 1;
    c->write = 0;
    emq_key_open(ctx, &c->active, active, rw);
    emq_key_open(ctx, &c->row, job, rw);
    if (!emq_type_ok(&c->active, REDISMODULE_KEYTYPE_ZSET) || !emq_type_ok(&c->row, REDISMODULE_KEYTYPE_HASH))
        return EMQ_ERR_WRONGTYPE;

    /* read and decide */
    int retry, first_route, err = EMQ_OK;
    int holder = emq_check_holder_or_retry(&c->active, &c->row, id, token, EMQ_VERB_COMPLETE, &retry, &first_route);
    if (holder == EMQ_HOLDER_GONE) c->reply = -1;
    else if (!retry) err = emq_holder_error(EMQ_VERB_COMPLETE, holder);
    if (holder != EMQ_HOLDER_OK || err) return err;
    RedisModuleString *base = emq_base_of(ctx, active, "active");
    if (!emq_acl_user(ctx, &c->user)) err = EMQ_ERR_NOPERM_DERIVED;
    else err = emq_read_meta(ctx, c->user, base, &c->meta);
    RedisModule_FreeString(ctx, base);
    c->write = !err;
    return err;
}

void emq_complete_apply(EmqFx *fx, EmqCompleting *c, RedisModuleString *id, long long now) {
    if (!c->write) return;
    emq_fx_zrem(fx, &c->active, id);
    emq_fx_hset(fx, &c->row, "hset", 3, emq_str.state, emq_str.done, emq_str.finished_at, emq_fx_number(fx, now),
                emq_str.closed_by, emq_str.complete);
    emq_fx_retain(fx, &c->row, now, c->meta.done_ttl);
}

void emq_complete_close(EmqCompleting *c) {
    emq_key_close(&c->row);
    emq_key_close(&c->active);
    if (c->user) RedisModule_FreeModuleUser(c->user);
}

int EmqComplete_RedisCommand(RedisModuleCtx *ctx, RedisModuleString **argv, int argc) {
    /* parse */
    if (argc != 5) return RedisModule_WrongArity(ctx);
    int err = emq_complete_check(argv[1], argv[2], argv[3]);
    if (err) return emq_reply_error(ctx, err);
    long long now = RedisModule_Milliseconds();

    /* open, read, decide */
    EmqCompleting c;
    EmqFx fx;
    emq_fx_begin(&fx, ctx);
    err = emq_complete_prepare(ctx, &c, argv[1], argv[2], argv[3], argv[4]);

    /* apply, reply */
    if (!err) emq_complete_apply(&fx, &c, argv[3], now);
    if (err) emq_reply_error(ctx, err);
    else RedisModule_ReplyWithLongLong(ctx, c.reply);
    emq_fx_commit(&fx);
    emq_complete_close(&c);
    return REDISMODULE_OK;
}

/* ------------------------------------------------------------------------
 * EMQ.FAIL <active> <pending> <dead> <base> <id> <token> <max-attempts> <error>
 *          [DELAY <ms>]
 *
 * The holder's handler failed.  Below <max-attempts> tries (claims since
 * the job was enqueued or last retried) the job goes back to <pending> at
 * server-now (+ DELAY ms: the worker's backoff; it is claimable again only
 * then), behind the work already waiting; at it, the job is
 * dead-lettered (into <dead>, scored with the time it died) and counted in
 * <base>metrics:failed.  The row keeps the error text in last_error either
 * way.  A job with a cancel request (EMQ.CANCEL) ends as state=cancelled
 * instead: never retried, not counted as failed.
 * Reply: +pending, +dead or +cancelled; :-1 gone; -EMQSTALE as COMPLETE.
 * ------------------------------------------------------------------------ */
int EmqFail_RedisCommand(RedisModuleCtx *ctx, RedisModuleString **argv, int argc) {
    /* parse */
    if (argc < 9) return RedisModule_WrongArity(ctx);
    int err = emq_check_queue(ctx, &argv[1], ACTIVE_PENDING_DEAD, 3, argv[4], EMQ_ERR_THREE_SETS);
    long long max_attempts = 0;
    if (!err) {
        size_t len;
        const char *s = RedisModule_StringPtrLen(argv[7], &len);
        err = emq_parse_count(EMQ_COUNT_MAX_ATTEMPTS, s, len, &max_attempts);
    }
    RedisModuleString *id = argv[5], *token = argv[6], *error_text = argv[8];
    long long now = RedisModule_Milliseconds(), due = now;
    if (!err && argc > 9) { /* [DELAY <ms>] */
        size_t len, vlen;
        const char *opt = RedisModule_StringPtrLen(argv[9], &len);
        if (argc != 11 || !emq_option_is(opt, len, "DELAY")) {
            err = EMQ_ERR_SYNTAX;
        } else {
            const char *val = RedisModule_StringPtrLen(argv[10], &vlen);
            err = emq_due_after_delay(now, val, vlen, &due);
        }
    }
    if (err) return emq_reply_error(ctx, err);

    /* open and type-check: the derived row's ACL before it is read */
    const int rw = REDISMODULE_READ | REDISMODULE_WRITE;
    RedisModuleUser *user = NULL;
    EmqKey active, pending, dead, row = {0}, metrics = {0};
    emq_key_open(ctx, &active, argv[1], rw);
    emq_key_open(ctx, &pending, argv[2], rw);
    emq_key_open(ctx, &dead, argv[3], rw);
    RedisModuleString *row_name = emq_derived_key(ctx, argv[4], "job:", id);
    RedisModuleString *metrics_name = NULL;
    EmqFx fx;
    emq_fx_begin(&fx, ctx);
    int reply_gone = 0, route = EMQ_FAIL_TO_PENDING;
    if (!emq_type_ok(&active, REDISMODULE_KEYTYPE_ZSET) || !emq_type_ok(&pending, REDISMODULE_KEYTYPE_ZSET) ||
        !emq_type_ok(&dead, REDISMODULE_KEYTYPE_ZSET))
        err = EMQ_ERR_WRONGTYPE;
    else err = emq_open_row(ctx, &user, &row, row_name);
    if (err) goto reply;

    /* read and decide */
    int retry;
    int holder = emq_check_holder_or_retry(&active, &row, id, token, EMQ_VERB_FAIL, &retry, &route);
    if (holder == EMQ_HOLDER_GONE) {
        reply_gone = 1;
        goto reply;
    }
    if (retry) goto reply; /* answer where the first call sent the job */
    err = emq_holder_error(EMQ_VERB_FAIL, holder);
    if (err) goto reply;
    /* The budget is `tries`; a row written before tries existed counts its attempts. */
    long long tries;
    int has_tries = emq_hexists(&row, emq_str.tries);
    err = emq_hash_incr(&row, has_tries ? emq_str.tries : emq_str.attempts, 0,
                        has_tries ? EMQ_ERR_TRIES_NOT_INTEGER : EMQ_ERR_ATTEMPTS_NOT_INTEGER, &tries);
    if (err) goto reply;
    route = emq_fail_route(tries, max_attempts, emq_hexists(&row, emq_str.cancel_requested));
    EmqMeta meta;
    err = emq_read_meta(ctx, user, argv[4], &meta);
    long long failed = 0;
    if (!err && route == EMQ_FAIL_TO_DEAD) {
        metrics_name = emq_derived_key(ctx, argv[4], "metrics:failed", NULL);
        err = emq_open_derived(ctx, user, &metrics, metrics_name, EMQ_DERIVED_READ_WRITE);
        if (!err && !emq_type_ok(&metrics, REDISMODULE_KEYTYPE_HASH)) err = EMQ_ERR_WRONGTYPE;
        if (!err) err = emq_hash_incr(&metrics, emq_str.count, 1, EMQ_ERR_FAILED_NOT_INTEGER, &failed);
    }
    if (err) goto reply;

    /* apply */
    RedisModuleString *at = emq_fx_number(&fx, now);
    emq_fx_zrem(&fx, &active, id);
    switch (route) {
    case EMQ_FAIL_TO_PENDING:
        emq_fx_hset(&fx, &row, "hset", 3, emq_str.state, emq_str.pending, emq_str.last_error, error_text,
                    emq_str.closed_by, emq_str.fail_pending);
        emq_fx_zadd(&fx, &pending, due, id, 0);
        break;
    case EMQ_FAIL_TO_DEAD:
        emq_fx_hset(&fx, &row, "hset", 4, emq_str.state, emq_str.dead, emq_str.last_error, error_text,
                    emq_str.finished_at, at, emq_str.closed_by, emq_str.fail_dead);
        emq_fx_zadd(&fx, &dead, now, id, 0);
        emq_fx_hset(&fx, &metrics, "hincrby", 1, emq_str.count, emq_fx_number(&fx, failed));
        break;
    default:
        emq_fx_hset(&fx, &row, "hset", 4, emq_str.state, emq_str.cancelled, emq_str.last_error, error_text,
                    emq_str.finished_at, at, emq_str.closed_by, emq_str.fail_cancelled);
        emq_fx_retain(&fx, &row, now, meta.cancelled_ttl);
        break;
    }

reply:
    if (err) {
        emq_reply_error(ctx, err);
    } else if (reply_gone) {
        RedisModule_ReplyWithLongLong(ctx, -1);
    } else {
        static const char *const outcome[] = {
            [EMQ_FAIL_TO_PENDING] = "pending",
            [EMQ_FAIL_TO_DEAD] = "dead",
            [EMQ_FAIL_TO_CANCELLED] = "cancelled",
        };
        RedisModule_ReplyWithSimpleString(ctx, outcome[route]);
    }
    emq_fx_commit(&fx);
    emq_key_close(&metrics);
    if (metrics_name) RedisModule_FreeString(ctx, metrics_name);
    emq_key_close(&row);
    RedisModule_FreeString(ctx, row_name);
    emq_key_close(&dead);
    int requeued = pending.modified;
    emq_key_close(&pending);
    if (requeued) emq_signal_due(ctx, argv[2], due, now);
    emq_key_close(&active);
    if (user) RedisModule_FreeModuleUser(user);
    return REDISMODULE_OK;
}

/* ------------------------------------------------------------------------
 * EMQ.RELEASE <active> <pending> <base> <id> <token>
 *
 * The holder gives the job back without using an attempt (a graceful
 * shutdown, a handler that cannot run it now): it leaves <active>, its row's
 * `tries` goes back down by one (never below 0) and no stall is counted; it
 * waits at the head of <pending> (score 0, beside recovered jobs).  A job
 * whose cancel was requested is not handed out again: it ends cancelled.
 * Reply: +pending or +cancelled; :-1 gone; -EMQSTALE as COMPLETE.
 * ------------------------------------------------------------------------ */
int EmqRelease_RedisCommand(RedisModuleCtx *ctx, RedisModuleString **argv, int argc) {
    /* parse */
    if (argc != 6) return RedisModule_WrongArity(ctx);
    int err = emq_check_queue(ctx, &argv[1], ACTIVE_PENDING_DEAD, 2, argv[3], EMQ_ERR_PENDING_ACTIVE_ORDER);
    if (err) return emq_reply_error(ctx, err);
    RedisModuleString *id = argv[4], *token = argv[5];
    long long now = RedisModule_Milliseconds();

    /* open and type-check: the derived row's ACL before it is read */
    const int rw = REDISMODULE_READ | REDISMODULE_WRITE;
    RedisModuleUser *user = NULL;
    EmqKey active, pending, row = {0};
    emq_key_open(ctx, &active, argv[1], rw);
    emq_key_open(ctx, &pending, argv[2], rw);
    RedisModuleString *row_name = emq_derived_key(ctx, argv[3], "job:", id);
    EmqFx fx;
    emq_fx_begin(&fx, ctx);
    int reply_gone = 0, cancelled = 0;
    if (!emq_type_ok(&active, REDISMODULE_KEYTYPE_ZSET) || !emq_type_ok(&pending, REDISMODULE_KEYTYPE_ZSET))
        err = EMQ_ERR_WRONGTYPE;
    else err = emq_open_row(ctx, &user, &row, row_name);
    if (err) goto reply;

    /* read and decide */
    int retry, first_route;
    int holder = emq_check_holder_or_retry(&active, &row, id, token, EMQ_VERB_RELEASE, &retry, &first_route);
    cancelled = emq_hexists(&row, emq_str.cancel_requested);
    if (holder == EMQ_HOLDER_GONE) reply_gone = 1;
    else if (retry) cancelled = first_route == EMQ_FAIL_TO_CANCELLED; /* the first call's answer */
    else err = emq_holder_error(EMQ_VERB_RELEASE, holder);
    if (holder != EMQ_HOLDER_OK || err) goto reply;
    long long tries = 0;
    err = emq_hash_incr(&row, emq_str.tries, 0, EMQ_ERR_TRIES_NOT_INTEGER, &tries);
    EmqMeta meta;
    if (!err && cancelled) err = emq_read_meta(ctx, user, argv[3], &meta);
    if (err) goto reply;

    /* apply */
    emq_fx_zrem(&fx, &active, id);
    if (cancelled) {
        emq_fx_hset(&fx, &row, "hset", 3, emq_str.state, emq_str.cancelled, emq_str.finished_at,
                    emq_fx_number(&fx, now), emq_str.closed_by, emq_str.release_cancelled);
        emq_fx_retain(&fx, &row, now, meta.cancelled_ttl);
    } else {
        emq_fx_hset(&fx, &row, "hset", 3, emq_str.tries, emq_fx_number(&fx, tries > 0 ? tries - 1 : 0),
                    emq_str.state, emq_str.pending, emq_str.closed_by, emq_str.release_pending);
        emq_fx_zadd(&fx, &pending, 0, id, 0);
    }

reply:
    if (err) emq_reply_error(ctx, err);
    else if (reply_gone) RedisModule_ReplyWithLongLong(ctx, -1);
    else RedisModule_ReplyWithSimpleString(ctx, cancelled ? "cancelled" : "pending");
    emq_fx_commit(&fx);
    emq_key_close(&row);
    RedisModule_FreeString(ctx, row_name);
    int requeued = pending.modified;
    emq_key_close(&pending);
    if (requeued) emq_signal_claimable(ctx, argv[2]);
    emq_key_close(&active);
    if (user) RedisModule_FreeModuleUser(user);
    return REDISMODULE_OK;
}
