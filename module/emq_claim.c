/* emq_claim.c -- a job's way through the queue: EMQ.ENQUEUE, EMQ.CLAIM,
 * EMQ.COMPLETE, EMQ.FAIL.
 *
 * ENQUEUE writes the row and puts the id in <pending>; CLAIM moves the
 * oldest pending id to <active> with a lease and bumps the row's `attempts`
 * -- the new value is the holder's fencing token; COMPLETE and FAIL are
 * accepted only from that holder, and only while the job is still active. */
#include <math.h>
#include <string.h>

#include "emq.h"

static const char *const PENDING_ACTIVE[] = {"pending", "active"};
static const char *const ACTIVE_PENDING_DEAD[] = {"active", "pending", "dead"};

/* ------------------------------------------------------------------------
 * EMQ.ENQUEUE <pending> <base> <id> <payload>
 *
 * :1 the row <base>job:<id> is created (state=pending, attempts=0, payload,
 * enqueued_at) and <id> waits in <pending> scored with server-now, so claims
 * take jobs first in, first out.  -EMQEXISTS when the row already exists:
 * an id names one job for its whole life (re-enqueueing would reset the
 * fencing token of whoever holds it now).
 * ------------------------------------------------------------------------ */
int EmqEnqueue_RedisCommand(RedisModuleCtx *ctx, RedisModuleString **argv, int argc) {
    /* parse */
    if (argc != 5) return RedisModule_WrongArity(ctx);
    int err = emq_check_queue(ctx, &argv[1], PENDING_ACTIVE, 1, argv[2], EMQ_ERR_PENDING_KEY);
    if (err) return emq_reply_error(ctx, err);
    RedisModuleString *id = argv[3], *payload = argv[4];
    long long now = RedisModule_Milliseconds();

    /* open and type-check */
    EmqKey pending, row;
    emq_key_open(ctx, &pending, argv[1], REDISMODULE_READ | REDISMODULE_WRITE);
    emq_key_open(ctx, &row, emq_derived_key(ctx, argv[2], "job:", id), REDISMODULE_READ | REDISMODULE_WRITE);
    EmqFx fx;
    emq_fx_begin(&fx, ctx);

    /* read and decide */
    if (!emq_type_ok(&pending, REDISMODULE_KEYTYPE_ZSET)) err = EMQ_ERR_WRONGTYPE;
    else if (!emq_key_empty(&row)) err = EMQ_ERR_EXISTS;
    else if (!emq_acl_allows_to(ctx, &row.name, 1, EMQ_DERIVED_CREATE)) err = EMQ_ERR_NOPERM_DERIVED;
    if (err) {
        emq_reply_error(ctx, err);
        goto done;
    }

    /* apply and reply */
    emq_fx_hset(&fx, &row, "hset", 4, emq_str.state, emq_str.pending, emq_str.attempts, emq_small_int[0],
                emq_str.payload, payload, emq_str.enqueued_at, emq_fx_number(&fx, now));
    emq_fx_zadd(&fx, &pending, now, id, 0);
    RedisModule_ReplyWithLongLong(ctx, 1);

done:
    emq_fx_commit(&fx);
    emq_key_close(&row);
    RedisModule_FreeString(ctx, row.name);
    emq_key_close(&pending);
    return REDISMODULE_OK;
}

/* ------------------------------------------------------------------------
 * EMQ.CLAIM <pending> <active> <base> <lease-ms>
 *
 * Takes the lowest-scored pending id (recovered jobs sit at 0, ahead of the
 * enqueue-time scores), increments its row's attempts -- the new value is
 * the holder's token -- sets state=active and leases it until server-now +
 * lease-ms.  Reply: [id, token], or a null reply when nothing is pending.
 *
 * A pending job whose row carries a cancel request (it was swept while its
 * holder was being cancelled) is never claimed: it leaves <pending> with
 * state=cancelled, and the next one is considered.  At most CLAIM_MAX_SKIPS
 * are dropped per call, which keeps the command O(log N).
 * ------------------------------------------------------------------------ */
#define CLAIM_MAX_SKIPS 16

typedef struct {
    RedisModuleString *id;
    EmqKey row;
} Head;

int EmqClaim_RedisCommand(RedisModuleCtx *ctx, RedisModuleString **argv, int argc) {
    /* parse */
    if (argc != 5) return RedisModule_WrongArity(ctx);
    int err = emq_check_queue(ctx, &argv[1], PENDING_ACTIVE, 2, argv[3], EMQ_ERR_PENDING_ACTIVE_KEYS);
    if (err) return emq_reply_error(ctx, err);
    size_t lease_len;
    const char *lease = RedisModule_StringPtrLen(argv[4], &lease_len);
    long long deadline;
    err = emq_lease_deadline(RedisModule_Milliseconds(), lease, lease_len, &deadline);
    if (err) return emq_reply_error(ctx, err);

    /* open and type-check */
    const int rw = REDISMODULE_READ | REDISMODULE_WRITE;
    EmqKey pending, active;
    emq_key_open(ctx, &pending, argv[1], rw);
    emq_key_open(ctx, &active, argv[2], rw);
    EmqFx fx;
    emq_fx_begin(&fx, ctx);
    Head heads[CLAIM_MAX_SKIPS + 1];
    int n = 0, found = 0;
    long long token = 0;
    if (!emq_type_ok(&pending, REDISMODULE_KEYTYPE_ZSET) || !emq_type_ok(&active, REDISMODULE_KEYTYPE_ZSET)) {
        emq_reply_error(ctx, EMQ_ERR_WRONGTYPE);
        goto done;
    }

    /* read and decide: the heads first, nothing written until every one checked out. */
    if (!emq_key_empty(&pending)) {
        RedisModule_ZsetFirstInScoreRange(pending.key, -HUGE_VAL, HUGE_VAL, 0, 0);
        while (!found && n <= CLAIM_MAX_SKIPS && !RedisModule_ZsetRangeEndReached(pending.key)) {
            double score;
            Head *h = &heads[n++];
            h->id = RedisModule_ZsetRangeCurrentElement(pending.key, &score);
            emq_key_open(ctx, &h->row, emq_derived_key(ctx, argv[3], "job:", h->id), rw);
            RedisModule_ZsetRangeNext(pending.key);
            if (!emq_type_ok(&h->row, REDISMODULE_KEYTYPE_HASH)) {
                err = EMQ_ERR_WRONGTYPE;
                break;
            }
            if (!emq_hexists(&h->row, emq_str.cancel_requested)) {
                found = 1;
                err = emq_hash_incr(&h->row, emq_str.attempts, 1, EMQ_ERR_ATTEMPTS_NOT_INTEGER, &token);
            }
        }
        RedisModule_ZsetRangeStop(pending.key);
    }
    if (!err) {
        RedisModuleString *names[CLAIM_MAX_SKIPS + 1];
        for (int i = 0; i < n; i++) names[i] = heads[i].row.name;
        if (!emq_acl_allows(ctx, names, (size_t)n)) err = EMQ_ERR_NOPERM_DERIVED;
    }
    if (err) {
        emq_reply_error(ctx, err);
        goto done;
    }

    /* apply and reply */
    int skipped = found ? n - 1 : n;
    for (int i = 0; i < skipped; i++) {
        emq_fx_zrem(&fx, &pending, heads[i].id);
        emq_fx_hset(&fx, &heads[i].row, "hset", 1, emq_str.state, emq_str.cancelled);
    }
    if (!found) {
        RedisModule_ReplyWithNull(ctx);
        goto done;
    }
    Head *h = &heads[n - 1];
    emq_fx_zrem(&fx, &pending, h->id);
    emq_fx_hset(&fx, &h->row, "hincrby", 1, emq_str.attempts, emq_fx_number(&fx, token));
    emq_fx_hset(&fx, &h->row, "hset", 1, emq_str.state, emq_str.active);
    emq_fx_zadd(&fx, &active, deadline, h->id, 0);
    RedisModule_ReplyWithArray(ctx, 2);
    RedisModule_ReplyWithString(ctx, h->id);
    RedisModule_ReplyWithLongLong(ctx, token);

done:
    emq_fx_commit(&fx);
    for (int i = 0; i < n; i++) {
        emq_key_close(&heads[i].row);
        RedisModule_FreeString(ctx, heads[i].row.name);
        RedisModule_FreeString(ctx, heads[i].id);
    }
    emq_key_close(&active);
    emq_key_close(&pending);
    return REDISMODULE_OK;
}

/* ------------------------------------------------------------------------
 * EMQ.COMPLETE <active> <job> <id> <token>
 *
 * :1 the job leaves <active> and its row gets state=done.  :-1 gone;
 * -EMQSTALE wrong token or no longer active (nothing written): a holder that
 * lost its lease must not finish a job someone else now owns.
 * ------------------------------------------------------------------------ */
int EmqComplete_RedisCommand(RedisModuleCtx *ctx, RedisModuleString **argv, int argc) {
    /* parse */
    if (argc != 5) return RedisModule_WrongArity(ctx);
    if (emq_str_equal(argv[1], argv[2])) return emq_reply_error(ctx, EMQ_ERR_SAME_KEY);
    RedisModuleString *id = argv[3], *token = argv[4];

    /* open and type-check */
    const int rw = REDISMODULE_READ | REDISMODULE_WRITE;
    EmqKey active, row;
    emq_key_open(ctx, &active, argv[1], rw);
    emq_key_open(ctx, &row, argv[2], rw);
    EmqFx fx;
    emq_fx_begin(&fx, ctx);
    if (!emq_type_ok(&active, REDISMODULE_KEYTYPE_ZSET) || !emq_type_ok(&row, REDISMODULE_KEYTYPE_HASH)) {
        emq_reply_error(ctx, EMQ_ERR_WRONGTYPE);
        goto done;
    }

    /* read and decide */
    int holder = emq_check_holder(&active, &row, id, token, NULL);
    if (holder == EMQ_HOLDER_GONE) {
        RedisModule_ReplyWithLongLong(ctx, -1);
        goto done;
    }
    if (holder != EMQ_HOLDER_OK) {
        emq_reply_error(ctx, emq_holder_error(EMQ_VERB_COMPLETE, holder));
        goto done;
    }

    /* apply and reply */
    emq_fx_zrem(&fx, &active, id);
    emq_fx_hset(&fx, &row, "hset", 1, emq_str.state, emq_str.done);
    RedisModule_ReplyWithLongLong(ctx, 1);

done:
    emq_fx_commit(&fx);
    emq_key_close(&row);
    emq_key_close(&active);
    return REDISMODULE_OK;
}

/* ------------------------------------------------------------------------
 * EMQ.FAIL <active> <pending> <dead> <base> <id> <token> <max-attempts> <error>
 *
 * The holder's handler failed.  Below <max-attempts> attempts the job goes
 * back to <pending> at server-now (behind the work already waiting); at or
 * above it the job is dead-lettered and counted in <base>metrics:failed.
 * The row keeps the error text in last_error either way.  A job with a
 * cancel request (EMQ.CANCEL) ends as state=cancelled instead: never retried,
 * not counted as failed.
 * Reply: +pending, +dead or +cancelled; :-1 gone; -EMQSTALE as COMPLETE.
 * ------------------------------------------------------------------------ */
int EmqFail_RedisCommand(RedisModuleCtx *ctx, RedisModuleString **argv, int argc) {
    /* parse */
    if (argc != 9) return RedisModule_WrongArity(ctx);
    int err = emq_check_queue(ctx, &argv[1], ACTIVE_PENDING_DEAD, 3, argv[4], EMQ_ERR_THREE_SETS);
    long long max_attempts = 0;
    if (!err) {
        size_t len;
        const char *s = RedisModule_StringPtrLen(argv[7], &len);
        err = emq_parse_count(EMQ_COUNT_MAX_ATTEMPTS, s, len, &max_attempts);
    }
    if (err) return emq_reply_error(ctx, err);
    RedisModuleString *id = argv[5], *token = argv[6], *error_text = argv[8];
    long long now = RedisModule_Milliseconds();

    /* open and type-check */
    const int rw = REDISMODULE_READ | REDISMODULE_WRITE;
    EmqKey active, pending, dead, row, metrics = {0};
    emq_key_open(ctx, &active, argv[1], rw);
    emq_key_open(ctx, &pending, argv[2], rw);
    emq_key_open(ctx, &dead, argv[3], rw);
    emq_key_open(ctx, &row, emq_derived_key(ctx, argv[4], "job:", id), rw);
    EmqFx fx;
    emq_fx_begin(&fx, ctx);
    if (!emq_type_ok(&active, REDISMODULE_KEYTYPE_ZSET) || !emq_type_ok(&pending, REDISMODULE_KEYTYPE_ZSET) ||
        !emq_type_ok(&dead, REDISMODULE_KEYTYPE_ZSET) || !emq_type_ok(&row, REDISMODULE_KEYTYPE_HASH)) {
        emq_reply_error(ctx, EMQ_ERR_WRONGTYPE);
        goto done;
    }

    /* read and decide */
    long long attempts = -1, failed = 0;
    int holder = emq_check_holder(&active, &row, id, token, &attempts);
    if (holder == EMQ_HOLDER_GONE) {
        RedisModule_ReplyWithLongLong(ctx, -1);
        goto done;
    }
    err = emq_holder_error(EMQ_VERB_FAIL, holder);
    if (!err && attempts < 0) err = EMQ_ERR_ATTEMPTS_NOT_INTEGER;
    int route = emq_fail_route(attempts, max_attempts, emq_hexists(&row, emq_str.cancel_requested));
    if (!err && route == EMQ_FAIL_TO_DEAD) {
        emq_key_open(ctx, &metrics, emq_derived_key(ctx, argv[4], "metrics:failed", NULL), rw);
        if (!emq_type_ok(&metrics, REDISMODULE_KEYTYPE_HASH)) err = EMQ_ERR_WRONGTYPE;
        else err = emq_hash_incr(&metrics, emq_str.count, 1, EMQ_ERR_FAILED_NOT_INTEGER, &failed);
    }
    if (!err) {
        RedisModuleString *derived[2] = {row.name, metrics.name};
        if (!emq_acl_allows(ctx, derived, 2)) err = EMQ_ERR_NOPERM_DERIVED;
    }
    if (err) {
        emq_reply_error(ctx, err);
        goto done;
    }

    /* apply and reply */
    static const char *const outcome[] = {
        [EMQ_FAIL_TO_PENDING] = "pending",
        [EMQ_FAIL_TO_DEAD] = "dead",
        [EMQ_FAIL_TO_CANCELLED] = "cancelled",
    };
    RedisModuleString *state = route == EMQ_FAIL_TO_DEAD        ? emq_str.dead
                               : route == EMQ_FAIL_TO_CANCELLED ? emq_str.cancelled
                                                                : emq_str.pending;
    emq_fx_zrem(&fx, &active, id);
    emq_fx_hset(&fx, &row, "hset", 2, emq_str.state, state, emq_str.last_error, error_text);
    if (route == EMQ_FAIL_TO_DEAD) {
        emq_fx_zadd(&fx, &dead, 0, id, 0);
        emq_fx_hset(&fx, &metrics, "hincrby", 1, emq_str.count, emq_fx_number(&fx, failed));
    } else if (route == EMQ_FAIL_TO_PENDING) {
        emq_fx_zadd(&fx, &pending, now, id, 0);
    }
    RedisModule_ReplyWithSimpleString(ctx, outcome[route]);

done:
    emq_fx_commit(&fx);
    emq_key_close(&metrics);
    if (metrics.name) RedisModule_FreeString(ctx, metrics.name);
    emq_key_close(&row);
    RedisModule_FreeString(ctx, row.name);
    emq_key_close(&dead);
    emq_key_close(&pending);
    emq_key_close(&active);
    return REDISMODULE_OK;
}
