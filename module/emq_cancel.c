/* emq_cancel.c -- remote cancel, delivered through the checkpoint.
 *
 * A cancel is a message, not a kill.  EMQ.CANCEL stores the request on the
 * job row (token-free: anyone may ask; the first reason is kept), and the
 * holder learns of it at its next checkpoint, EMQ.CHECKPOINT (emq.c, beside
 * EMQ.EXTEND) -- the way a heartbeat carries cancellation back to an
 * activity.  A job that is only
 * waiting is cancelled on the spot: it leaves <pending> and is never claimed. */
#include <string.h>

#include "emq_cancel.h"
#include "emq_core.h"
#include "emq_glue.h"

/* ------------------------------------------------------------------------
 * EMQ.CANCEL <pending> <base> <id> <reason>
 *
 * +cancelled  the job was pending: it left <pending>, state=cancelled
 * +requested  the job is held (or otherwise not pending): the request is on
 *             the row for the holder's next EMQ.CHECKPOINT
 * +finished   the job is done, dead or cancelled already: nothing written
 * :-1         no such job
 * ------------------------------------------------------------------------ */
static int is_finished(RedisModuleCtx *ctx, RedisModuleKey *row) {
    RedisModuleString *state = NULL;
    RedisModule_HashGet(row, REDISMODULE_HASH_CFIELDS, "state", &state, NULL);
    if (state == NULL) return 0;
    size_t len;
    const char *s = RedisModule_StringPtrLen(state, &len);
    int finished = (len == 4 && memcmp(s, "done", 4) == 0) ||
                   (len == 4 && memcmp(s, "dead", 4) == 0) ||
                   (len == 9 && memcmp(s, "cancelled", 9) == 0);
    RedisModule_FreeString(ctx, state);
    return finished;
}

static int EmqCancel_RedisCommand(RedisModuleCtx *ctx, RedisModuleString **argv, int argc) {
    if (argc != 5) return RedisModule_WrongArity(ctx);
    const char *err = emq_check_pending_queue(ctx, argv[1], argv[2]);
    if (err) return RedisModule_ReplyWithError(ctx, err);
    RedisModuleString *id = argv[3], *reason = argv[4];

    const int rw = REDISMODULE_READ | REDISMODULE_WRITE;
    RedisModuleString *row_name = emq_derived_key(ctx, argv[2], "job:", id);
    RedisModuleKey *pending = RedisModule_OpenKey(ctx, argv[1], rw);
    RedisModuleKey *row = RedisModule_OpenKey(ctx, row_name, rw);
    double score;
    if (!emq_type_ok(pending, REDISMODULE_KEYTYPE_ZSET) || !emq_type_ok(row, REDISMODULE_KEYTYPE_HASH)) {
        RedisModule_ReplyWithError(ctx, REDISMODULE_ERRORMSG_WRONGTYPE);
    } else if (RedisModule_KeyType(row) == REDISMODULE_KEYTYPE_EMPTY) {
        RedisModule_ReplyWithLongLong(ctx, -1);
    } else if (!emq_acl_allows(ctx, &row_name, 1)) {
        RedisModule_ReplyWithError(ctx, EMQ_NOPERM_DERIVED);
    } else if (RedisModule_ZsetScore(pending, id, &score) == REDISMODULE_OK) {
        RedisModuleString *state = RedisModule_CreateString(ctx, "cancelled", 9);
        int first = !emq_has_cancel_request(row);
        emq_zrem(ctx, pending, argv[1], id);
        if (first) {
            RedisModule_HashSet(row, REDISMODULE_HASH_CFIELDS, "state", state, "cancel_requested",
                                reason, NULL);
            RedisModule_Replicate(ctx, "HSET", "scscs", row_name, "state", state,
                                  "cancel_requested", reason);
        } else {
            RedisModule_HashSet(row, REDISMODULE_HASH_CFIELDS, "state", state, NULL);
            RedisModule_Replicate(ctx, "HSET", "scs", row_name, "state", state);
        }
        emq_notify_hset(ctx, row_name);
        RedisModule_Replicate(ctx, "ZREM", "ss", argv[1], id);
        RedisModule_FreeString(ctx, state);
        RedisModule_ReplyWithSimpleString(ctx, "cancelled");
    } else if (is_finished(ctx, row)) {
        RedisModule_ReplyWithSimpleString(ctx, "finished");
    } else {
        /* Idempotent: asking again keeps the first reason. */
        if (!emq_has_cancel_request(row)) {
            RedisModule_HashSet(row, REDISMODULE_HASH_CFIELDS, "cancel_requested", reason, NULL);
            emq_notify_hset(ctx, row_name);
            RedisModule_Replicate(ctx, "HSET", "scs", row_name, "cancel_requested", reason);
        }
        RedisModule_ReplyWithSimpleString(ctx, "requested");
    }
    RedisModule_CloseKey(row);
    RedisModule_CloseKey(pending);
    RedisModule_FreeString(ctx, row_name);
    return REDISMODULE_OK;
}

int emq_register_cancel(RedisModuleCtx *ctx) {
    /* CANCEL writes a reason onto a row: deny-oom.  Its delivery,
     * EMQ.CHECKPOINT, lives beside EMQ.EXTEND in emq.c: it is EXTEND. */
    return RedisModule_CreateCommand(ctx, "emq.cancel", EmqCancel_RedisCommand,
                                     "write deny-oom fast", 1, 1, 1);
}
