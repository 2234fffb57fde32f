/* emq_cancel.c -- remote cancel: EMQ.CANCEL stores the request.
 *
 * A cancel is a message, not a kill.  EMQ.CANCEL is token-free (anyone may
 * ask; the first reason is kept) and the holder learns of the request at
 * its next checkpoint, EMQ.CHECKPOINT (emq_lease.c) -- the way a heartbeat
 * carries cancellation back to a running activity.  A job that is only
 * waiting is cancelled on the spot: it leaves <pending> and is never
 * claimed. */
#include "emq.h"

/* ------------------------------------------------------------------------
 * EMQ.CANCEL <pending> <base> <id> <reason>
 *
 * +cancelled  the job was pending: it left <pending>, state=cancelled
 * +requested  the job is held (or otherwise not pending): the request is on
 *             the row for the holder's next EMQ.CHECKPOINT
 * +finished   the job is done, dead or cancelled already: nothing written
 * :-1         no such job
 * ------------------------------------------------------------------------ */
static int row_is_finished(EmqKey *row) {
    RedisModuleString *state = emq_hget(row, emq_str.state);
    if (state == NULL) return 0;
    size_t len;
    const char *s = RedisModule_StringPtrLen(state, &len);
    int finished = emq_state_is_finished(s, len);
    RedisModule_FreeString(NULL, state);
    return finished;
}

int EmqCancel_RedisCommand(RedisModuleCtx *ctx, RedisModuleString **argv, int argc) {
    /* parse */
    if (argc != 5) return RedisModule_WrongArity(ctx);
    static const char *const pending_only[] = {"pending"};
    int err = emq_check_queue(ctx, &argv[1], pending_only, 1, argv[2], EMQ_ERR_PENDING_KEY);
    if (err) return emq_reply_error(ctx, err);
    RedisModuleString *id = argv[3], *reason = argv[4];

    /* open and type-check */
    const int rw = REDISMODULE_READ | REDISMODULE_WRITE;
    EmqKey pending, row;
    emq_key_open(ctx, &pending, argv[1], rw);
    emq_key_open(ctx, &row, emq_derived_key(ctx, argv[2], "job:", id), rw);
    EmqFx fx;
    emq_fx_begin(&fx, ctx);
    if (!emq_type_ok(&pending, REDISMODULE_KEYTYPE_ZSET) || !emq_type_ok(&row, REDISMODULE_KEYTYPE_HASH)) {
        emq_reply_error(ctx, EMQ_ERR_WRONGTYPE);
        goto done;
    }

    /* read and decide */
    int exists = !emq_key_empty(&row);
    if (exists && !emq_acl_allows(ctx, &row.name, 1)) {
        emq_reply_error(ctx, EMQ_ERR_NOPERM_DERIVED);
        goto done;
    }
    double score;
    int in_pending = exists && RedisModule_ZsetScore(pending.key, id, &score) == REDISMODULE_OK;
    int decision = emq_cancel_decide(exists, in_pending, exists && !in_pending && row_is_finished(&row));
    /* Idempotent: asking again keeps the first reason. */
    int first = exists && !emq_hexists(&row, emq_str.cancel_requested);

    /* apply and reply */
    switch (decision) {
    case EMQ_CANCEL_GONE:
        RedisModule_ReplyWithLongLong(ctx, -1);
        break;
    case EMQ_CANCEL_NOW:
        emq_fx_zrem(&fx, &pending, id);
        if (first)
            emq_fx_hset(&fx, &row, "hset", 2, emq_str.state, emq_str.cancelled, emq_str.cancel_requested,
                        reason);
        else
            emq_fx_hset(&fx, &row, "hset", 1, emq_str.state, emq_str.cancelled);
        RedisModule_ReplyWithSimpleString(ctx, "cancelled");
        break;
    case EMQ_CANCEL_FINISHED:
        RedisModule_ReplyWithSimpleString(ctx, "finished");
        break;
    case EMQ_CANCEL_REQUEST:
        if (first) emq_fx_hset(&fx, &row, "hset", 1, emq_str.cancel_requested, reason);
        RedisModule_ReplyWithSimpleString(ctx, "requested");
        break;
    }

done:
    emq_fx_commit(&fx);
    emq_key_close(&row);
    RedisModule_FreeString(ctx, row.name);
    emq_key_close(&pending);
    return REDISMODULE_OK;
}
