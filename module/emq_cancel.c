/* emq_cancel.c -- remote cancel: EMQ.CANCEL stores the request.
 *
 * A cancel is a message, not a kill.  EMQ.CANCEL is token-free (anyone may
 * ask; the first reason is kept) and the holder learns of the request at
 * its next checkpoint, EMQ.CHECKPOINT (emq_lease.c) -- the way a heartbeat
 * carries cancellation back to a running activity.  A job that is only
 * waiting is cancelled on the spot and never claimed: it leaves
 * <base>delayed or <base>priority, or its entry in <pending> becomes a
 * tombstone that claims drop (emq_lanes.h: removing it from the middle of a
 * list would be O(n)). */
#include "emq.h"

/* ------------------------------------------------------------------------
 * EMQ.CANCEL <pending> <base> <id> <reason>
 *
 * +cancelled  the job was waiting (state pending): it left its lane,
 *             state=cancelled, and its id is announced on <base>done:<id>
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
    long long now = RedisModule_Milliseconds();

    /* open and type-check: the derived row's ACL before it is read; <pending>
     * is only checked (a waiting job's entry stays, a tombstone) */
    RedisModuleUser *user = NULL;
    EmqKey pending, row = {0};
    emq_key_open(ctx, &pending, argv[1], REDISMODULE_READ);
    RedisModuleString *row_name = emq_derived_key(ctx, argv[2], "job:", id);
    EmqFx fx;
    emq_fx_begin(&fx, ctx);
    EmqLanes lanes;
    emq_lanes_init(&lanes, ctx, NULL, argv[2], &pending);
    EmqEnd end;
    emq_end_init(&end, ctx, argv[2]);
    int decision = EMQ_CANCEL_GONE;
    if (!emq_type_ok(&pending, REDISMODULE_KEYTYPE_LIST)) err = EMQ_ERR_WRONGTYPE;
    else err = emq_open_row(ctx, &user, &row, row_name);
    if (err) goto reply;

    /* read and decide: a row that says pending is a waiting job (in a lane,
     * or delayed) */
    int exists = !emq_key_empty(&row);
    RedisModuleString *state = emq_hget(&row, emq_str.state);
    /* a job waiting for its dependencies (emq_deps.h) is in no lane */
    int after = state && emq_str_equal(state, emq_str.waiting);
    int waiting = state && (emq_str_equal(state, emq_str.pending) || after);
    if (state) RedisModule_FreeString(NULL, state);
    decision = emq_cancel_decide(exists, waiting, exists && !waiting && row_is_finished(&row));
    /* Idempotent: asking again keeps the first reason. */
    int first = exists && !emq_hexists(&row, emq_str.cancel_requested);
    EmqMeta meta;
    if (decision == EMQ_CANCEL_NOW) {
        err = emq_read_meta(ctx, user, argv[2], &meta);
        lanes.user = user;
        if (!err && !after) err = emq_lanes_remove_row(&lanes, id, &row);
        if (!err) err = emq_ended_prepare(&end, id, EMQ_END_CANCELLED, 0);
    }
    if (err) goto reply;

    /* apply */
    if (decision == EMQ_CANCEL_NOW) {
        RedisModuleString *at = emq_fx_number(&fx, now);
        emq_lanes_apply(&lanes, &fx);
        if (first)
            emq_fx_hset(&fx, &row, "hset", 3, emq_str.state, emq_str.cancelled, emq_str.finished_at, at,
                        emq_str.cancel_requested, reason);
        else
            emq_fx_hset(&fx, &row, "hset", 2, emq_str.state, emq_str.cancelled, emq_str.finished_at, at);
        emq_ended_apply(&end, &fx, id, EMQ_END_CANCELLED, 0);
        emq_fx_retain(&fx, &row, now, meta.cancelled_ttl);
    } else if (decision == EMQ_CANCEL_REQUEST && first) {
        emq_fx_hset(&fx, &row, "hset", 1, emq_str.cancel_requested, reason);
        /* Tell the holder now: workers listen on <base>cancel and checkpoint
         * the job at once, which delivers the reason.  A message nobody
         * hears is harmless: the next checkpoint delivers it anyway. */
        RedisModuleString *channel = emq_derived_key(ctx, argv[2], "cancel", NULL);
        RedisModule_PublishMessage(ctx, channel, id);
        RedisModule_FreeString(ctx, channel);
    }

reply:
    if (err) {
        emq_reply_error(ctx, err);
    } else {
        switch (decision) {
        case EMQ_CANCEL_GONE:
            RedisModule_ReplyWithLongLong(ctx, -1);
            break;
        case EMQ_CANCEL_NOW:
            RedisModule_ReplyWithSimpleString(ctx, "cancelled");
            break;
        case EMQ_CANCEL_FINISHED:
            RedisModule_ReplyWithSimpleString(ctx, "finished");
            break;
        default:
            RedisModule_ReplyWithSimpleString(ctx, "requested");
            break;
        }
    }
    emq_fx_commit(&fx);
    emq_lanes_close(&lanes);
    emq_end_close(&end);
    emq_key_close(&row);
    RedisModule_FreeString(ctx, row_name);
    emq_key_close(&pending);
    if (user) RedisModule_FreeModuleUser(user);
    return REDISMODULE_OK;
}
