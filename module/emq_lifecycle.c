/* emq_lifecycle.c -- the rest of a job's life: enqueue, claim, complete, fail.
 *
 * Same rules as EMQ.EXTEND and EMQ.SWEEP (emq.c): the server clock is read
 * once, everything is validated before the first write, effects are
 * propagated as core commands with absolute values, and the fencing token is
 * the row's `attempts`: CLAIM increments it and hands the new value to the
 * holder; COMPLETE and FAIL are accepted only from that holder, and only while
 * the job is still in the active set. */
#include <math.h>
#include <string.h>

#include "emq_core.h"
#include "emq_glue.h"
#include "emq_lifecycle.h"

static const char *const PENDING_ACTIVE[] = {"pending", "active"};
static const char *const ACTIVE_PENDING_DEAD[] = {"active", "pending", "dead"};

/* Replies for a holder that is not the current one; 0 when it is. */
static int reply_not_holder(RedisModuleCtx *ctx, EmqHolder h, const char *verb) {
    switch (h) {
    case EMQ_HOLDER_GONE:
        RedisModule_ReplyWithLongLong(ctx, -1);
        return 1;
    case EMQ_HOLDER_STALE_TOKEN:
        RedisModule_ReplyWithError(ctx, strcmp(verb, "complete") == 0
                                            ? "EMQSTALE complete token mismatch"
                                            : "EMQSTALE fail token mismatch");
        return 1;
    case EMQ_HOLDER_NOT_ACTIVE:
        RedisModule_ReplyWithError(ctx, "EMQSTALE job is no longer active");
        return 1;
    case EMQ_HOLDER_OK:
        break;
    }
    return 0;
}

/* ------------------------------------------------------------------------
 * EMQ.ENQUEUE <pending> <base> <id> <payload>
 *
 * :1 the row <base>job:<id> is created (state=pending, attempts=0, payload,
 * enqueued_at) and <id> waits in <pending> scored with server-now, so claims
 * take jobs first in, first out.  -EMQEXISTS when the row already exists.
 * ------------------------------------------------------------------------ */
static int EmqEnqueue_RedisCommand(RedisModuleCtx *ctx, RedisModuleString **argv, int argc) {
    if (argc != 5) return RedisModule_WrongArity(ctx);
    const char *err = emq_check_pending_queue(ctx, argv[1], argv[2]);
    if (err) return RedisModule_ReplyWithError(ctx, err);
    RedisModuleString *id = argv[3], *payload = argv[4];
    long long now = RedisModule_Milliseconds();

    RedisModuleString *row_name = emq_derived_key(ctx, argv[2], "job:", id);
    RedisModuleKey *pending = RedisModule_OpenKey(ctx, argv[1], REDISMODULE_READ | REDISMODULE_WRITE);
    RedisModuleKey *row = RedisModule_OpenKey(ctx, row_name, REDISMODULE_READ | REDISMODULE_WRITE);
    if (!emq_type_ok(pending, REDISMODULE_KEYTYPE_ZSET)) {
        RedisModule_ReplyWithError(ctx, REDISMODULE_ERRORMSG_WRONGTYPE);
    } else if (RedisModule_KeyType(row) != REDISMODULE_KEYTYPE_EMPTY) {
        /* An id names one job for its whole life: re-enqueueing would reset
         * the fencing token of whoever holds it now. */
        RedisModule_ReplyWithError(ctx, "EMQEXISTS a job with this id already exists");
    } else if (!emq_acl_allows(ctx, &row_name, 1)) {
        RedisModule_ReplyWithError(ctx, EMQ_NOPERM_DERIVED);
    } else {
        RedisModuleString *zero = emq_ll_string(ctx, 0), *at = emq_ll_string(ctx, now);
        RedisModuleString *state = RedisModule_CreateString(ctx, "pending", 7);
        RedisModule_HashSet(row, REDISMODULE_HASH_CFIELDS, "state", state, "attempts", zero,
                            "payload", payload, "enqueued_at", at, NULL);
        emq_notify_hset(ctx, row_name);
        emq_zadd(ctx, pending, argv[1], (double)now, id);
        RedisModule_Replicate(ctx, "HSET", "scscscscs", row_name, "state", state, "attempts", zero,
                              "payload", payload, "enqueued_at", at);
        RedisModule_Replicate(ctx, "ZADD", "sls", argv[1], now, id);
        RedisModule_FreeString(ctx, state);
        RedisModule_FreeString(ctx, at);
        RedisModule_FreeString(ctx, zero);
        RedisModule_ReplyWithLongLong(ctx, 1);
    }
    RedisModule_CloseKey(row);
    RedisModule_CloseKey(pending);
    RedisModule_FreeString(ctx, row_name);
    return REDISMODULE_OK;
}

/* ------------------------------------------------------------------------
 * EMQ.CLAIM <pending> <active> <base> <lease-ms>
 *
 * Takes the lowest-scored pending id (recovered jobs sit at 0, ahead of the
 * enqueue-time scores), increments its row's attempts -- the new value is the
 * holder's token -- sets state=active and leases it until server-now +
 * lease-ms.  Reply: [id, token], or a null reply when nothing is pending.
 *
 * A pending job whose row carries a cancel request (it was swept while its
 * holder was being cancelled) is never claimed: it leaves <pending> with
 * state=cancelled, and the next one is considered.  At most CLAIM_MAX_SKIPS
 * are dropped per call, which keeps the command O(log N).
 * ------------------------------------------------------------------------ */
#define CLAIM_MAX_SKIPS 16

typedef struct {
    RedisModuleString *id, *row_name;
    RedisModuleKey *row;
} Head;

static int EmqClaim_RedisCommand(RedisModuleCtx *ctx, RedisModuleString **argv, int argc) {
    if (argc != 5) return RedisModule_WrongArity(ctx);
    const char *err =
        emq_check_queue(ctx, &argv[1], PENDING_ACTIVE, 2, argv[3],
                        "ERR <pending> and <active> must be <base>pending and <base>active");
    if (err) return RedisModule_ReplyWithError(ctx, err);
    size_t lease_len;
    const char *lease = RedisModule_StringPtrLen(argv[4], &lease_len);
    long long deadline;
    err = emq_lease_deadline(RedisModule_Milliseconds(), lease, lease_len, &deadline);
    if (err) return RedisModule_ReplyWithError(ctx, err);

    const int rw = REDISMODULE_READ | REDISMODULE_WRITE;
    RedisModuleKey *pending = RedisModule_OpenKey(ctx, argv[1], rw);
    RedisModuleKey *active = RedisModule_OpenKey(ctx, argv[2], rw);
    Head heads[CLAIM_MAX_SKIPS + 1];
    int n = 0, found = 0;
    long long token = 0;
    if (!emq_type_ok(pending, REDISMODULE_KEYTYPE_ZSET) ||
        !emq_type_ok(active, REDISMODULE_KEYTYPE_ZSET)) {
        RedisModule_ReplyWithError(ctx, REDISMODULE_ERRORMSG_WRONGTYPE);
        goto done;
    }

    /* Read the heads first and write nothing until every one checked out. */
    if (RedisModule_KeyType(pending) != REDISMODULE_KEYTYPE_EMPTY) {
        RedisModule_ZsetFirstInScoreRange(pending, -HUGE_VAL, HUGE_VAL, 0, 0);
        while (!found && n <= CLAIM_MAX_SKIPS && !RedisModule_ZsetRangeEndReached(pending)) {
            double score;
            Head *h = &heads[n++];
            h->id = RedisModule_ZsetRangeCurrentElement(pending, &score);
            h->row_name = emq_derived_key(ctx, argv[3], "job:", h->id);
            h->row = RedisModule_OpenKey(ctx, h->row_name, rw);
            RedisModule_ZsetRangeNext(pending);
            if (!emq_type_ok(h->row, REDISMODULE_KEYTYPE_HASH)) {
                err = REDISMODULE_ERRORMSG_WRONGTYPE;
                break;
            }
            if (!emq_has_cancel_request(h->row)) {
                found = 1;
                err = emq_hash_incr(ctx, h->row, "attempts", emq_next_attempts, &token);
            }
        }
        RedisModule_ZsetRangeStop(pending);
    }
    if (!err) {
        RedisModuleString *names[CLAIM_MAX_SKIPS + 1];
        for (int i = 0; i < n; i++) names[i] = heads[i].row_name;
        if (!emq_acl_allows(ctx, names, (size_t)n)) err = EMQ_NOPERM_DERIVED;
    }
    if (err) {
        RedisModule_ReplyWithError(ctx, err);
        goto done;
    }

    int skipped = found ? n - 1 : n;
    if (skipped) {
        RedisModuleString *state = RedisModule_CreateString(ctx, "cancelled", 9);
        for (int i = 0; i < skipped; i++) {
            emq_zrem(ctx, pending, argv[1], heads[i].id);
            RedisModule_HashSet(heads[i].row, REDISMODULE_HASH_CFIELDS, "state", state, NULL);
            emq_notify_hset(ctx, heads[i].row_name);
            RedisModule_Replicate(ctx, "ZREM", "ss", argv[1], heads[i].id);
            RedisModule_Replicate(ctx, "HSET", "scs", heads[i].row_name, "state", state);
        }
        RedisModule_FreeString(ctx, state);
    }
    if (!found) {
        RedisModule_ReplyWithNull(ctx);
        goto done;
    }

    Head *h = &heads[n - 1];
    RedisModuleString *tok = emq_ll_string(ctx, token);
    RedisModuleString *state = RedisModule_CreateString(ctx, "active", 6);
    emq_zrem(ctx, pending, argv[1], h->id);
    RedisModule_HashSet(h->row, REDISMODULE_HASH_CFIELDS, "attempts", tok, "state", state, NULL);
    RedisModule_NotifyKeyspaceEvent(ctx, REDISMODULE_NOTIFY_HASH, "hincrby", h->row_name);
    emq_notify_hset(ctx, h->row_name);
    emq_zadd(ctx, active, argv[2], (double)deadline, h->id);
    RedisModule_Replicate(ctx, "ZREM", "ss", argv[1], h->id);
    RedisModule_Replicate(ctx, "HSET", "scscs", h->row_name, "attempts", tok, "state", state);
    RedisModule_Replicate(ctx, "ZADD", "sls", argv[2], deadline, h->id);
    RedisModule_ReplyWithArray(ctx, 2);
    RedisModule_ReplyWithString(ctx, h->id);
    RedisModule_ReplyWithLongLong(ctx, token);
    RedisModule_FreeString(ctx, state);
    RedisModule_FreeString(ctx, tok);

done:
    for (int i = 0; i < n; i++) {
        RedisModule_CloseKey(heads[i].row);
        RedisModule_FreeString(ctx, heads[i].row_name);
        RedisModule_FreeString(ctx, heads[i].id);
    }
    RedisModule_CloseKey(active);
    RedisModule_CloseKey(pending);
    return REDISMODULE_OK;
}

/* ------------------------------------------------------------------------
 * EMQ.COMPLETE <active> <job> <id> <token>
 *
 * :1 the job leaves <active> and its row gets state=done.  :-1 gone;
 * -EMQSTALE wrong token or no longer active (nothing written): a holder that
 * lost its lease must not finish a job someone else now owns.
 * ------------------------------------------------------------------------ */
static int EmqComplete_RedisCommand(RedisModuleCtx *ctx, RedisModuleString **argv, int argc) {
    if (argc != 5) return RedisModule_WrongArity(ctx);
    if (emq_str_equal(argv[1], argv[2]))
        return RedisModule_ReplyWithError(ctx, "ERR <active> and <job> must be different keys");
    RedisModuleString *id = argv[3], *token = argv[4];

    const int rw = REDISMODULE_READ | REDISMODULE_WRITE;
    RedisModuleKey *active = RedisModule_OpenKey(ctx, argv[1], rw);
    RedisModuleKey *row = RedisModule_OpenKey(ctx, argv[2], rw);
    if (!emq_type_ok(active, REDISMODULE_KEYTYPE_ZSET) ||
        !emq_type_ok(row, REDISMODULE_KEYTYPE_HASH)) {
        RedisModule_ReplyWithError(ctx, REDISMODULE_ERRORMSG_WRONGTYPE);
    } else if (!reply_not_holder(ctx, emq_check_holder(ctx, active, row, id, token, NULL), "complete")) {
        RedisModuleString *state = RedisModule_CreateString(ctx, "done", 4);
        emq_zrem(ctx, active, argv[1], id);
        RedisModule_HashSet(row, REDISMODULE_HASH_CFIELDS, "state", state, NULL);
        emq_notify_hset(ctx, argv[2]);
        RedisModule_Replicate(ctx, "ZREM", "ss", argv[1], id);
        RedisModule_Replicate(ctx, "HSET", "scs", argv[2], "state", state);
        RedisModule_FreeString(ctx, state);
        RedisModule_ReplyWithLongLong(ctx, 1);
    }
    RedisModule_CloseKey(row);
    RedisModule_CloseKey(active);
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
static const char *failed_plus_one(const char *cur, size_t len, int present, long long *next) {
    return emq_add_failed(cur, len, present, 1, next);
}

static int EmqFail_RedisCommand(RedisModuleCtx *ctx, RedisModuleString **argv, int argc) {
    if (argc != 9) return RedisModule_WrongArity(ctx);
    const char *err = emq_check_queue(ctx, &argv[1], ACTIVE_PENDING_DEAD, 3, argv[4], EMQ_ERR_THREE_SETS);
    size_t len;
    long long max_attempts = 0;
    if (!err) {
        const char *s = RedisModule_StringPtrLen(argv[7], &len);
        err = emq_parse_count("max-attempts", s, len, &max_attempts);
    }
    if (err) return RedisModule_ReplyWithError(ctx, err);
    RedisModuleString *id = argv[5], *token = argv[6], *error_text = argv[8];
    long long now = RedisModule_Milliseconds();

    const int rw = REDISMODULE_READ | REDISMODULE_WRITE;
    RedisModuleKey *active = RedisModule_OpenKey(ctx, argv[1], rw);
    RedisModuleKey *pending = RedisModule_OpenKey(ctx, argv[2], rw);
    RedisModuleKey *dead = RedisModule_OpenKey(ctx, argv[3], rw);
    RedisModuleString *row_name = emq_derived_key(ctx, argv[4], "job:", id);
    RedisModuleString *metrics_name = NULL;
    RedisModuleKey *row = RedisModule_OpenKey(ctx, row_name, rw), *metrics = NULL;
    long long attempts = -1, failed = 0;
    if (!emq_type_ok(active, REDISMODULE_KEYTYPE_ZSET) ||
        !emq_type_ok(pending, REDISMODULE_KEYTYPE_ZSET) ||
        !emq_type_ok(dead, REDISMODULE_KEYTYPE_ZSET) || !emq_type_ok(row, REDISMODULE_KEYTYPE_HASH)) {
        RedisModule_ReplyWithError(ctx, REDISMODULE_ERRORMSG_WRONGTYPE);
        goto done;
    }
    if (reply_not_holder(ctx, emq_check_holder(ctx, active, row, id, token, &attempts), "fail"))
        goto done;
    if (attempts < 0) {
        RedisModule_ReplyWithError(ctx, "ERR the job row's 'attempts' field is not an integer");
        goto done;
    }
    /* A job whose cancel was requested and delivered stops here: it is not
     * retried, and it is not a failure of the job itself. */
    int cancelled = emq_has_cancel_request(row);
    int to_dead = !cancelled && attempts >= max_attempts;
    if (to_dead) {
        metrics_name = emq_derived_key(ctx, argv[4], "metrics:failed", NULL);
        metrics = RedisModule_OpenKey(ctx, metrics_name, rw);
        if (!emq_type_ok(metrics, REDISMODULE_KEYTYPE_HASH)) {
            RedisModule_ReplyWithError(ctx, REDISMODULE_ERRORMSG_WRONGTYPE);
            goto done;
        }
        if ((err = emq_hash_incr(ctx, metrics, "count", failed_plus_one, &failed)) != NULL) {
            RedisModule_ReplyWithError(ctx, err);
            goto done;
        }
    }
    RedisModuleString *derived[2] = {row_name, metrics_name};
    if (!emq_acl_allows(ctx, derived, 2)) {
        RedisModule_ReplyWithError(ctx, EMQ_NOPERM_DERIVED);
        goto done;
    }

    const char *outcome = cancelled ? "cancelled" : to_dead ? "dead" : "pending";
    RedisModuleString *state = RedisModule_CreateString(ctx, outcome, strlen(outcome));
    emq_zrem(ctx, active, argv[1], id);
    RedisModule_HashSet(row, REDISMODULE_HASH_CFIELDS, "state", state, "last_error", error_text,
                        NULL);
    emq_notify_hset(ctx, row_name);
    RedisModule_Replicate(ctx, "ZREM", "ss", argv[1], id);
    RedisModule_Replicate(ctx, "HSET", "scscs", row_name, "state", state, "last_error", error_text);
    if (to_dead) {
        RedisModuleString *count = emq_ll_string(ctx, failed);
        emq_zadd(ctx, dead, argv[3], 0, id);
        RedisModule_HashSet(metrics, REDISMODULE_HASH_CFIELDS, "count", count, NULL);
        RedisModule_NotifyKeyspaceEvent(ctx, REDISMODULE_NOTIFY_HASH, "hincrby", metrics_name);
        RedisModule_Replicate(ctx, "ZADD", "sls", argv[3], 0LL, id);
        RedisModule_Replicate(ctx, "HSET", "scs", metrics_name, "count", count);
        RedisModule_FreeString(ctx, count);
    } else if (!cancelled) {
        emq_zadd(ctx, pending, argv[2], (double)now, id);
        RedisModule_Replicate(ctx, "ZADD", "sls", argv[2], now, id);
    }
    RedisModule_FreeString(ctx, state);
    RedisModule_ReplyWithSimpleString(ctx, outcome);

done:
    if (metrics) RedisModule_CloseKey(metrics);
    if (metrics_name) RedisModule_FreeString(ctx, metrics_name);
    RedisModule_CloseKey(row);
    RedisModule_FreeString(ctx, row_name);
    RedisModule_CloseKey(dead);
    RedisModule_CloseKey(pending);
    RedisModule_CloseKey(active);
    return REDISMODULE_OK;
}

/* ------------------------------------------------------------------------ */

int emq_register_lifecycle(RedisModuleCtx *ctx) {
    /* ENQUEUE, CLAIM and FAIL write new data (rows, error text): refused past
     * maxmemory.  COMPLETE only removes a member and overwrites `state`, so
     * a worker can still finish its job under memory pressure. */
    struct {
        const char *name;
        RedisModuleCmdFunc fn;
        const char *flags;
        int first, last;
    } cmds[] = {
        {"emq.enqueue", EmqEnqueue_RedisCommand, "write deny-oom fast", 1, 1},
        {"emq.claim", EmqClaim_RedisCommand, "write deny-oom fast", 1, 2},
        {"emq.complete", EmqComplete_RedisCommand, "write fast", 1, 2},
        {"emq.fail", EmqFail_RedisCommand, "write deny-oom fast", 1, 3},
    };
    for (size_t i = 0; i < sizeof cmds / sizeof cmds[0]; i++)
        if (RedisModule_CreateCommand(ctx, cmds[i].name, cmds[i].fn, cmds[i].flags, cmds[i].first,
                                      cmds[i].last, 1) != REDISMODULE_OK)
            return REDISMODULE_ERR;
    return REDISMODULE_OK;
}
