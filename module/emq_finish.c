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
 * EMQ.COMPLETE <active> <job> <id> <token> [RESULT <bytes>]
 *
 * :1 the job leaves <active>; its row gets state=done, finished_at and
 * closed_by (and `result`, in pieces, with RESULT), and expires after the
 * queue's done retention; its id is announced on <base>done:<id>.  :-1
 * gone; -EMQSTALE wrong token or no longer active (nothing written).  A
 * RESULT over emq.max-result-bytes is refused, and so is one past
 * maxmemory (COMPLETE itself is not deny-oom: a result grows memory, the
 * end of a job does not).
 *
 * Its steps are shared with EMQ.COMPLETECLAIM (emq_claim.c), which
 * completes and claims in one call: everything both check comes before
 * anything either writes.
 * ------------------------------------------------------------------------ */
int emq_complete_check(RedisModuleString *active, RedisModuleString *job, RedisModuleString *id) {
    if (emq_str_equal(active, job)) return EMQ_ERR_SAME_KEY;
    return check_job_key(active, job, id);
}

int emq_check_result(RedisModuleString *result) {
    if (result == NULL) return EMQ_OK;
    size_t len;
    RedisModule_StringPtrLen(result, &len);
    return (long long)len > emq_config_max_result_bytes() ? EMQ_ERR_RESULT_TOO_LARGE : EMQ_OK;
}

int emq_complete_prepare(RedisModuleCtx *ctx, EmqCompleting *c, RedisModuleString *active, RedisModuleString *job,
                         RedisModuleString *id, RedisModuleString *token, RedisModuleString *result) {
    /* open and type-check */
    const int rw = REDISMODULE_READ | REDISMODULE_WRITE;
    c->user = NULL;
    c->reply = 1;
    c->write = 0;
    c->result = result;
    c->base = emq_base_of(ctx, active, "active");
    emq_end_init(&c->end, ctx, c->base);
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
    if (!emq_acl_user(ctx, &c->user)) err = EMQ_ERR_NOPERM_DERIVED;
    else err = emq_read_meta(ctx, c->user, c->base, &c->meta);
    if (!err) err = emq_left_active_prepare(&c->end, id, &c->row);
    if (!err) err = emq_ended_prepare_row(&c->end, id, EMQ_END_DONE, 0, &c->row, c->meta.deps);
    c->write = !err;
    return err;
}

void emq_complete_apply(EmqFx *fx, EmqCompleting *c, RedisModuleString *id, long long now) {
    if (!c->write) return;
    emq_fx_zrem(fx, &c->active, id);
    emq_left_active_apply(&c->end, fx, id);
    RedisModuleString *fields[EMQ_MAX_PIECES + 3], *values[EMQ_MAX_PIECES + 3];
    fields[0] = emq_str.state, values[0] = emq_str.done;
    fields[1] = emq_str.finished_at, values[1] = emq_fx_number(fx, now);
    fields[2] = emq_str.closed_by, values[2] = emq_str.complete;
    int n = 3, pieces = 0;
    if (c->result) {
        pieces = emq_row_pieces(fx, EMQ_VALUE_RESULT, c->result, fields + 3, values + 3);
        n += pieces;
    }
    /* A result written over another (a row written by hand) keeps none of its pieces. */
    emq_row_drop_pieces(fx, &c->row, EMQ_VALUE_RESULT, c->result ? pieces : 0);
    emq_fx_hset_argv(fx, &c->row, "hset", n, fields, values);
    emq_ended_apply(&c->end, fx, id, EMQ_END_DONE, 0);
    emq_fx_retain(fx, &c->row, now, c->meta.done_ttl);
}

void emq_complete_close(EmqCompleting *c) {
    emq_key_close(&c->row);
    emq_key_close(&c->active);
    emq_end_close(&c->end);
    if (c->base) RedisModule_FreeString(NULL, c->base);
    c->base = NULL;
    if (c->user) RedisModule_FreeModuleUser(c->user);
}

/* [RESULT <bytes>] from argv[from] on, checked against its ceiling and,
 * for a command that is not deny-oom, against maxmemory. */
int emq_parse_result(RedisModuleCtx *ctx, RedisModuleString **argv, int from, int argc, int oom_check,
                     RedisModuleString **result) {
    *result = NULL;
    for (int i = from; i < argc; i += 2) {
        size_t len;
        const char *opt = RedisModule_StringPtrLen(argv[i], &len);
        if (i + 1 >= argc || *result || !emq_option_is(opt, len, "RESULT")) return EMQ_ERR_SYNTAX;
        *result = argv[i + 1];
    }
    int err = emq_check_result(*result);
    if (!err && *result && oom_check && (RedisModule_GetContextFlags(ctx) & REDISMODULE_CTX_FLAGS_OOM))
        err = EMQ_ERR_OOM;
    return err;
}

int EmqComplete_RedisCommand(RedisModuleCtx *ctx, RedisModuleString **argv, int argc) {
    /* parse */
    if (argc < 5) return RedisModule_WrongArity(ctx);
    int err = emq_complete_check(argv[1], argv[2], argv[3]);
    RedisModuleString *result = NULL;
    if (!err) err = emq_parse_result(ctx, argv, 5, argc, 1, &result);
    if (err) return emq_reply_error(ctx, err);
    long long now = RedisModule_Milliseconds();

    /* open, read, decide */
    EmqCompleting c;
    EmqFx fx;
    emq_fx_begin(&fx, ctx);
    err = emq_complete_prepare(ctx, &c, argv[1], argv[2], argv[3], argv[4], result);

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
 *          [DELAY <ms>] [TRACE <text>] [DEAD]
 *
 * The holder's handler failed.  Below <max-attempts> tries (claims since
 * the job was enqueued or last retried) the job goes back to the tail of
 * its lane, claimable again at once -- or, with DELAY ms (the worker's
 * backoff), to <base>delayed until then; at it, or at once with DEAD (the
 * handler said a retry cannot help), the job is dead-lettered (into
 * <dead>, scored with the time it died) and counted in
 * <base>metrics:failed.  The row keeps the error text in last_error and,
 * with TRACE, the traceback in `traceback` (a FAIL without TRACE deletes an
 * earlier one: the two always describe the same failure).  A job with a
 * cancel request (EMQ.CANCEL) ends as state=cancelled instead: never
 * retried, not counted as failed.  A job that ends (dead, cancelled) is
 * announced on <base>done:<id>.
 * Reply: +pending, +dead or +cancelled; :-1 gone; -EMQSTALE as COMPLETE.
 * ------------------------------------------------------------------------ */

/* FAIL's options from argv[9] on: [DELAY <ms>] [TRACE <text>] [DEAD], each
 * once, in any order. */
static int parse_fail_options(RedisModuleString **argv, int argc, long long now, long long *due,
                              RedisModuleString **trace, int *dead) {
    int seen_delay = 0;
    *due = now;
    *trace = NULL;
    *dead = 0;
    for (int i = 9; i < argc; i++) {
        size_t len, vlen;
        const char *opt = RedisModule_StringPtrLen(argv[i], &len);
        if (emq_option_is(opt, len, "DEAD") && !*dead) {
            *dead = 1;
            continue;
        }
        if (i + 1 >= argc) return EMQ_ERR_SYNTAX;
        const char *val = RedisModule_StringPtrLen(argv[i + 1], &vlen);
        if (emq_option_is(opt, len, "DELAY") && !seen_delay) {
            seen_delay = 1;
            int err = emq_due_after_delay(now, val, vlen, due);
            if (err) return err;
        } else if (emq_option_is(opt, len, "TRACE") && !*trace) {
            if (vlen > EMQ_MAX_TRACE_BYTES) return EMQ_ERR_TRACE_TOO_LARGE;
            *trace = argv[i + 1];
        } else {
            return EMQ_ERR_SYNTAX;
        }
        i++;
    }
    return EMQ_OK;
}

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
    RedisModuleString *id = argv[5], *token = argv[6], *error_text = argv[8], *trace = NULL;
    long long now = RedisModule_Milliseconds(), due = now;
    int dead_now = 0;
    if (!err) err = parse_fail_options(argv, argc, now, &due, &trace, &dead_now);
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
    EmqLanes lanes;
    emq_lanes_init(&lanes, ctx, NULL, argv[4], &pending);
    EmqEnd end;
    emq_end_init(&end, ctx, argv[4]);
    int reply_gone = 0, route = EMQ_FAIL_TO_PENDING;
    if (!emq_type_ok(&active, REDISMODULE_KEYTYPE_ZSET) || !emq_type_ok(&pending, REDISMODULE_KEYTYPE_LIST) ||
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
    route = emq_fail_route(tries, max_attempts, emq_hexists(&row, emq_str.cancel_requested), dead_now);
    EmqMeta meta;
    err = emq_read_meta(ctx, user, argv[4], &meta);
    long long failed = 0;
    if (!err && route == EMQ_FAIL_TO_DEAD) {
        metrics_name = emq_derived_key(ctx, argv[4], "metrics:failed", NULL);
        err = emq_open_derived(ctx, user, &metrics, metrics_name, EMQ_DERIVED_READ_WRITE);
        if (!err && !emq_type_ok(&metrics, REDISMODULE_KEYTYPE_HASH)) err = EMQ_ERR_WRONGTYPE;
        if (!err) err = emq_hash_incr(&metrics, emq_str.count, 1, EMQ_ERR_FAILED_NOT_INTEGER, &failed);
    }
    if (!err && route == EMQ_FAIL_TO_PENDING) {
        lanes.user = user;
        /* A grouped job retried at once goes back to its group's head: with
         * a cap of 1 a group is a sequence, and a retry behind its
         * successors would break its order.  Ungrouped, or with DELAY: the
         * tail (a new turn) when due. */
        RedisModuleString *group = emq_row_group(&row);
        if (group && due == now) err = emq_lanes_place_row(&lanes, id, &row, EMQ_AT_HEAD);
        else err = emq_lanes_enter_row(&lanes, id, &row, due, now);
        if (group) RedisModule_FreeString(NULL, group);
    }
    if (!err) err = emq_left_active_prepare(&end, id, &row);
    if (!err && route != EMQ_FAIL_TO_PENDING)
        err = emq_ended_prepare(&end, id, route == EMQ_FAIL_TO_DEAD ? EMQ_END_DEAD : EMQ_END_CANCELLED, 0);
    if (err) goto reply;

    /* apply */
    RedisModuleString *at = emq_fx_number(&fx, now);
    emq_fx_zrem(&fx, &active, id);
    emq_left_active_apply(&end, &fx, id);
    if (trace == NULL) emq_fx_hdel(&fx, &row, emq_str.traceback);
    RedisModuleString *fields[5], *values[5];
    int n = 0;
    fields[n] = emq_str.state, values[n++] = route == EMQ_FAIL_TO_PENDING ? emq_str.pending
                                            : route == EMQ_FAIL_TO_DEAD  ? emq_str.dead
                                                                         : emq_str.cancelled;
    fields[n] = emq_str.last_error, values[n++] = error_text;
    if (trace) fields[n] = emq_str.traceback, values[n++] = trace;
    if (route != EMQ_FAIL_TO_PENDING) fields[n] = emq_str.finished_at, values[n++] = at;
    fields[n] = emq_str.closed_by, values[n++] = route == EMQ_FAIL_TO_PENDING ? emq_str.fail_pending
                                                : route == EMQ_FAIL_TO_DEAD  ? emq_str.fail_dead
                                                                             : emq_str.fail_cancelled;
    emq_fx_hset_argv(&fx, &row, "hset", n, fields, values);
    switch (route) {
    case EMQ_FAIL_TO_PENDING:
        emq_lanes_apply(&lanes, &fx);
        break;
    case EMQ_FAIL_TO_DEAD:
        emq_fx_zadd(&fx, &dead, now, id, 0);
        emq_fx_hset(&fx, &metrics, "hincrby", 1, emq_str.count, emq_fx_number(&fx, failed));
        emq_ended_apply(&end, &fx, id, EMQ_END_DEAD, 0);
        break;
    default:
        emq_ended_apply(&end, &fx, id, EMQ_END_CANCELLED, 0);
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
    int requeued = pending.modified || lanes.priority.modified || lanes.delayed.modified;
    emq_lanes_close(&lanes);
    emq_end_close(&end);
    emq_key_close(&metrics);
    if (metrics_name) RedisModule_FreeString(ctx, metrics_name);
    emq_key_close(&row);
    RedisModule_FreeString(ctx, row_name);
    emq_key_close(&dead);
    emq_key_close(&pending);
    if (requeued) emq_signal_due(ctx, argv[2], due, now);
    emq_key_close(&active);
    if (user) RedisModule_FreeModuleUser(user);
    return REDISMODULE_OK;
}

/* ------------------------------------------------------------------------
 * EMQ.RELEASE <active> <pending> <base> <id> <token> [BACKOFF <ms>]
 *
 * The holder gives the job back without using an attempt (a graceful
 * shutdown, a handler that cannot run it now): it leaves <active>, its row's
 * `tries` goes back down by one (never below 0) and no stall is counted; it
 * waits at the head of its lane (the head of <pending>, or below the first
 * job of its level in <base>priority), before the jobs that waited there,
 * the last one given back first (emq_lanes.h).  A job whose
 * cancel was requested is not handed out again: it ends cancelled (and is
 * announced on <base>done:<id>).
 * With BACKOFF (a handler's 429, emq_flow.h), the same call also stops
 * every claim of the queue until server-now + <ms>, so the job given back
 * is not handed out again at once.
 * Reply: +pending or +cancelled; :-1 gone; -EMQSTALE as COMPLETE.
 * ------------------------------------------------------------------------ */
int EmqRelease_RedisCommand(RedisModuleCtx *ctx, RedisModuleString **argv, int argc) {
    /* parse */
    if (argc < 6) return RedisModule_WrongArity(ctx);
    long long backoff = 0;
    int err = EMQ_OK;
    if (argc != 6) {
        size_t len, vlen;
        const char *opt = RedisModule_StringPtrLen(argv[6], &len);
        if (argc != 8 || !emq_option_is(opt, len, "BACKOFF")) err = EMQ_ERR_SYNTAX;
        const char *v = argc == 8 ? RedisModule_StringPtrLen(argv[7], &vlen) : NULL;
        if (!err) err = emq_parse_backoff(v, vlen, &backoff);
    }
    if (!err) err = emq_check_queue(ctx, &argv[1], ACTIVE_PENDING_DEAD, 2, argv[3], EMQ_ERR_PENDING_ACTIVE_ORDER);
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
    EmqLanes lanes;
    emq_lanes_init(&lanes, ctx, NULL, argv[3], &pending);
    EmqEnd end;
    emq_end_init(&end, ctx, argv[3]);
    EmqFlow flow = {0};
    int reply_gone = 0, cancelled = 0;
    if (!emq_type_ok(&active, REDISMODULE_KEYTYPE_ZSET) || !emq_type_ok(&pending, REDISMODULE_KEYTYPE_LIST))
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
    if (!err && !cancelled) {
        lanes.user = user;
        err = emq_lanes_place_row(&lanes, id, &row, EMQ_AT_HEAD);
    }
    if (!err) err = emq_left_active_prepare(&end, id, &row);
    if (!err && cancelled) err = emq_ended_prepare(&end, id, EMQ_END_CANCELLED, 0);
    if (!err && backoff) err = emq_flow_backoff_prepare(&flow, ctx, user, argv[3], now, backoff);
    if (err) goto reply;

    /* apply */
    emq_fx_zrem(&fx, &active, id);
    emq_left_active_apply(&end, &fx, id);
    if (cancelled) {
        emq_fx_hset(&fx, &row, "hset", 3, emq_str.state, emq_str.cancelled, emq_str.finished_at,
                    emq_fx_number(&fx, now), emq_str.closed_by, emq_str.release_cancelled);
        emq_ended_apply(&end, &fx, id, EMQ_END_CANCELLED, 0);
        emq_fx_retain(&fx, &row, now, meta.cancelled_ttl);
    } else {
        emq_fx_hset(&fx, &row, "hset", 3, emq_str.tries, emq_fx_number(&fx, tries > 0 ? tries - 1 : 0),
                    emq_str.state, emq_str.pending, emq_str.closed_by, emq_str.release_pending);
        emq_lanes_apply(&lanes, &fx);
    }
    emq_flow_backoff_apply(&flow, &fx);

reply:
    if (err) emq_reply_error(ctx, err);
    else if (reply_gone) RedisModule_ReplyWithLongLong(ctx, -1);
    else RedisModule_ReplyWithSimpleString(ctx, cancelled ? "cancelled" : "pending");
    emq_fx_commit(&fx);
    int requeued = pending.modified || lanes.priority.modified;
    emq_lanes_close(&lanes);
    emq_end_close(&end);
    emq_flow_close(&flow);
    emq_key_close(&row);
    RedisModule_FreeString(ctx, row_name);
    emq_key_close(&pending);
    if (requeued) emq_signal_claimable(ctx, argv[2]);
    emq_key_close(&active);
    if (user) RedisModule_FreeModuleUser(user);
    return REDISMODULE_OK;
}
