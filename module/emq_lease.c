/* emq_lease.c -- a holder keeps its lease: EMQ.EXTEND and EMQ.CHECKPOINT.
 *
 * The lease IS the active set's score, so extending it is one ZADD XX of
 * the deadline, guarded by the fence (the row's token and the id's
 * membership in <active>).  EXTEND is the hot path of every running job:
 * one row lookup and one skiplist update, nothing else. */
#include <string.h>

#include "emq.h"

/* ------------------------------------------------------------------------
 * EMQ.EXTEND <active> <job> <id> <token> <lease-ms>
 *
 * :1 the lease now ends at server-now + lease-ms; :-1 the row is gone;
 * -EMQSTALE the token is not the row's, or <id> is no longer active.
 *
 * EMQ.CHECKPOINT <active> <job> <id> <token> <lease-ms> [STATE <bytes>]
 *                [PROGRESS <bytes>]
 *
 * The same for holders that want remote cancels delivered (EMQ.CANCEL,
 * emq_cancel.c): on success it answers [1, reason], the stored cancel
 * request or null, instead of :1.  With STATE, the bytes are stored on the
 * row in the same step (fields checkpoint, checkpoint_at,
 * checkpoint_attempt), fenced like the lease: a stale holder's state is
 * refused with its extension.  The next claim of the job hands the state
 * back, so a recovered job resumes where its last holder left off.  With
 * PROGRESS, the bytes are stored as the row's `progress`, fenced the same
 * way, for anyone to read (EMQ.CHECKPOINT's state is the job's own).
 *
 * State grows memory, the lease does not: past maxmemory a checkpoint WITH
 * state (or progress) is refused (-OOM, nothing written) while one without
 * still extends the lease -- the worker sends the checkpoint again without
 * the state at once (its next checkpoint with state replaces what was
 * lost).  Both sizes are capped by emq.max-state-bytes.
 * ------------------------------------------------------------------------ */
static int extend_lease(RedisModuleCtx *ctx, RedisModuleString **argv, int argc, int with_cancel) {
    /* parse */
    if (with_cancel ? argc < 6 : argc != 6) return RedisModule_WrongArity(ctx);
    RedisModuleString *state = NULL, *progress = NULL;
    for (int i = 6; i < argc; i += 2) {
        size_t len;
        const char *opt = RedisModule_StringPtrLen(argv[i], &len);
        if (i + 1 < argc && !state && emq_option_is(opt, len, "STATE")) state = argv[i + 1];
        else if (i + 1 < argc && !progress && emq_option_is(opt, len, "PROGRESS")) progress = argv[i + 1];
        else return emq_reply_error(ctx, EMQ_ERR_SYNTAX);
    }
    RedisModuleString *id = argv[3], *token = argv[4];
    /* Opening one key twice with WRITE is undefined in the module API. */
    if (emq_str_equal(argv[1], argv[2])) return emq_reply_error(ctx, EMQ_ERR_SAME_KEY);
    /* The fence checks the token of <job>'s row: it must be <id>'s own row,
     * or a holder could keep another job's lease alive with its token. */
    size_t alen, jlen, idlen;
    const char *a = RedisModule_StringPtrLen(argv[1], &alen), *j = RedisModule_StringPtrLen(argv[2], &jlen);
    const char *idp = RedisModule_StringPtrLen(id, &idlen);
    if (!emq_job_key_matches(a, alen, j, jlen, idp, idlen)) return emq_reply_error(ctx, EMQ_ERR_JOB_KEY);
    size_t lease_len;
    const char *lease = RedisModule_StringPtrLen(argv[5], &lease_len);
    long long deadline;
    long long now = RedisModule_Milliseconds();
    int err = emq_lease_deadline(now, lease, lease_len, &deadline);
    size_t state_len = 0, progress_len = 0;
    if (state) RedisModule_StringPtrLen(state, &state_len);
    if (progress) RedisModule_StringPtrLen(progress, &progress_len);
    if (!err && (long long)state_len > emq_config_max_state_bytes()) err = EMQ_ERR_STATE_TOO_LARGE;
    if (!err && (long long)progress_len > emq_config_max_state_bytes()) err = EMQ_ERR_PROGRESS_TOO_LARGE;
    if (!err && (state || progress) && (RedisModule_GetContextFlags(ctx) & REDISMODULE_CTX_FLAGS_OOM))
        err = EMQ_ERR_OOM;
    if (err) return emq_reply_error(ctx, err);

    /* open and type-check */
    EmqKey active, row;
    emq_key_open(ctx, &active, argv[1], REDISMODULE_READ | REDISMODULE_WRITE);
    emq_key_open(ctx, &row, argv[2], state || progress ? REDISMODULE_READ | REDISMODULE_WRITE : REDISMODULE_READ);
    EmqFx fx;
    emq_fx_begin(&fx, ctx);
    if (!emq_type_ok(&active, REDISMODULE_KEYTYPE_ZSET) || !emq_type_ok(&row, REDISMODULE_KEYTYPE_HASH)) {
        emq_reply_error(ctx, EMQ_ERR_WRONGTYPE);
        goto done;
    }

    /* read and decide: the token first; membership comes with the write. */
    RedisModuleString *current = emq_hget(&row, emq_str.token);
    if (current == NULL) {
        RedisModule_ReplyWithLongLong(ctx, -1);
        goto done;
    }
    int same_holder = emq_str_equal(current, token);
    RedisModule_FreeString(NULL, current);
    if (!same_holder) {
        emq_reply_error(ctx, emq_holder_error(EMQ_VERB_EXTEND, EMQ_HOLDER_STALE_TOKEN));
        goto done;
    }

    /* apply.  The token still matches until the next claim, but a sweep
     * may already have taken the job: re-adding it would hand a recovered
     * or dead job back to a holder that lost it.  ZADD XX is the membership
     * check and the write in one lookup: it answers NOP, and changes
     * nothing, when <id> is not a member.  A deadline equal to the current
     * score changes nothing, so nothing is propagated and no event fires. */
    if (emq_fx_zadd(&fx, &active, deadline, id, 1) & REDISMODULE_ZADD_NOP) {
        emq_reply_error(ctx, emq_holder_error(EMQ_VERB_EXTEND, EMQ_HOLDER_NOT_ACTIVE));
        goto done;
    }

    /* One HSET of the state's fields and the progress, as the core command would be. */
    RedisModuleString *fields[4], *values[4], *attempts = NULL;
    int n = 0;
    if (state) {
        attempts = emq_hget(&row, emq_str.attempts);
        fields[n] = emq_str.checkpoint, values[n++] = state;
        fields[n] = emq_str.checkpoint_at, values[n++] = emq_fx_number(&fx, now);
        fields[n] = emq_str.checkpoint_attempt, values[n++] = attempts ? attempts : emq_small_int[0];
    }
    if (progress) fields[n] = emq_str.progress, values[n++] = progress;
    if (n) emq_fx_hset_argv(&fx, &row, "hset", n, fields, values);
    if (attempts) RedisModule_FreeString(NULL, attempts);

    /* reply */
    if (!with_cancel) {
        RedisModule_ReplyWithLongLong(ctx, 1);
        goto done;
    }
    RedisModuleString *reason = emq_hget(&row, emq_str.cancel_requested);
    RedisModule_ReplyWithArray(ctx, 2);
    RedisModule_ReplyWithLongLong(ctx, 1);
    if (reason) {
        RedisModule_ReplyWithString(ctx, reason);
        RedisModule_FreeString(NULL, reason);
    } else {
        RedisModule_ReplyWithNull(ctx);
    }

done:
    emq_fx_commit(&fx);
    emq_key_close(&row);
    emq_key_close(&active);
    return REDISMODULE_OK;
}

int EmqExtend_RedisCommand(RedisModuleCtx *ctx, RedisModuleString **argv, int argc) {
    return extend_lease(ctx, argv, argc, 0);
}

int EmqCheckpoint_RedisCommand(RedisModuleCtx *ctx, RedisModuleString **argv, int argc) {
    return extend_lease(ctx, argv, argc, 1);
}
