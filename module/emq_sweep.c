/* emq_sweep.c -- lapsed leases: EMQ.SWEEP recovers or dead-letters them.
 *
 * A job whose holder stopped checkpointing has a deadline in the past.  The
 * sweep takes such jobs, oldest deadline first, counts a stall on each row,
 * and sends each back to pending -- or, at <max-stalled> stalls, to the
 * dead set: a job that keeps killing its workers is poison.
 *
 * collect (the lapsed ids, bounded by <limit>) -> decide (read and check
 * every row first: a sweep applies to all its jobs or to none) -> apply. */
#include <math.h>
#include <string.h>

#include "emq.h"

/* ------------------------------------------------------------------------
 * EMQ.SWEEP <active> <pending> <dead> <base> <max-stalled> <limit>
 *
 * Reply: [recovered ids, dead ids], each in processing order.
 * ------------------------------------------------------------------------ */

/* One lapsed job: its id, its row, and what the sweep decided for it. */
typedef struct {
    RedisModuleString *id;
    EmqKey row;
    long long stalled;
    int dead;
} SweptJob;

typedef struct {
    RedisModuleCtx *ctx;
    RedisModuleString *base;
    SweptJob *jobs;
    size_t count, cap;
    EmqKey active, pending, dead, metrics;
    long long failed; /* the metric's count after this sweep */
    RedisModuleUser *user; /* the caller, for the derived keys' ACL; NULL: no check */
} Sweep;

static void sweep_release(Sweep *s) {
    for (size_t i = 0; i < s->count; i++) {
        emq_key_close(&s->jobs[i].row);
        if (s->jobs[i].row.name) RedisModule_FreeString(s->ctx, s->jobs[i].row.name);
        RedisModule_FreeString(s->ctx, s->jobs[i].id);
    }
    RedisModule_Free(s->jobs);
    emq_key_close(&s->metrics);
    if (s->metrics.name) RedisModule_FreeString(s->ctx, s->metrics.name);
    emq_key_close(&s->dead);
    emq_key_close(&s->pending);
    emq_key_close(&s->active);
    if (s->user) RedisModule_FreeModuleUser(s->user);
}

/* Collect the lapsed members and name their rows.  The range iterator must
 * be closed before the set is modified, so the ids are copied out first. */
static void sweep_collect(Sweep *s, long long now, long long limit) {
    if (emq_key_empty(&s->active)) return;
    RedisModule_ZsetFirstInScoreRange(s->active.key, -HUGE_VAL, (double)now, 0, 0);
    while (!RedisModule_ZsetRangeEndReached(s->active.key) && (long long)s->count < limit) {
        if (s->count == s->cap) {
            s->cap = s->cap ? s->cap * 2 : 16;
            s->jobs = RedisModule_Realloc(s->jobs, s->cap * sizeof *s->jobs);
        }
        SweptJob *j = &s->jobs[s->count++];
        memset(j, 0, sizeof *j);
        double score;
        j->id = RedisModule_ZsetRangeCurrentElement(s->active.key, &score);
        j->row.name = emq_derived_key(s->ctx, s->base, "job:", j->id);
        RedisModule_ZsetRangeNext(s->active.key);
    }
    RedisModule_ZsetRangeStop(s->active.key);
}

/* Read every row the sweep will write and decide its fate.  Returns EMQ_OK
 * or the error to answer; nothing has been written either way. */
static int sweep_decide(Sweep *s, long long max_stalled) {
    for (size_t i = 0; i < s->count; i++)
        if (!emq_acl_may_touch(s->user, s->jobs[i].row.name)) return EMQ_ERR_NOPERM_DERIVED;

    long long deaths = 0;
    for (size_t i = 0; i < s->count; i++) {
        SweptJob *j = &s->jobs[i];
        emq_key_open(s->ctx, &j->row, j->row.name, REDISMODULE_READ | REDISMODULE_WRITE);
        if (!emq_type_ok(&j->row, REDISMODULE_KEYTYPE_HASH)) return EMQ_ERR_WRONGTYPE;
        /* A row that vanished while its id stayed active is re-created by the
         * stall count, as HINCRBY would: the id is not silently dropped. */
        int err = emq_hash_incr(&j->row, emq_str.stalled, 1, EMQ_ERR_STALLED_NOT_INTEGER, &j->stalled);
        if (err) return err;
        j->dead = emq_stall_is_dead(j->stalled, max_stalled);
        deaths += j->dead;
    }
    if (deaths == 0) return EMQ_OK;

    RedisModuleString *metrics_name = emq_derived_key(s->ctx, s->base, "metrics:failed", NULL);
    if (!emq_acl_may_touch(s->user, metrics_name)) {
        RedisModule_FreeString(s->ctx, metrics_name);
        return EMQ_ERR_NOPERM_DERIVED;
    }
    emq_key_open(s->ctx, &s->metrics, metrics_name, REDISMODULE_READ | REDISMODULE_WRITE);
    if (!emq_type_ok(&s->metrics, REDISMODULE_KEYTYPE_HASH)) return EMQ_ERR_WRONGTYPE;
    int err = emq_hash_incr(&s->metrics, emq_str.count, deaths, EMQ_ERR_FAILED_NOT_INTEGER, &s->failed);
    s->failed -= deaths; /* counted up again, one per death, as the jobs die */
    return err;
}

/* Apply the decisions, job by job, in the order of the seed's Lua: the
 * keyspace events then come in the sequence its consumers know. */
static void sweep_apply(Sweep *s, EmqFx *fx) {
    for (size_t i = 0; i < s->count; i++) {
        SweptJob *j = &s->jobs[i];
        emq_fx_zrem(fx, &s->active, j->id);
        emq_fx_hset(fx, &j->row, "hincrby", 1, emq_str.stalled, emq_fx_number(fx, j->stalled));
        if (j->dead) {
            emq_fx_hset(fx, &j->row, "hset", 1, emq_str.state, emq_str.dead);
            emq_fx_hset(fx, &j->row, "hset", 1, emq_str.last_error, emq_str.stalled);
            emq_fx_zadd(fx, &s->dead, 0, j->id, 0);
            emq_fx_hset(fx, &s->metrics, "hincrby", 1, emq_str.count, emq_fx_number(fx, ++s->failed));
        } else {
            emq_fx_zadd(fx, &s->pending, 0, j->id, 0);
            emq_fx_hset(fx, &j->row, "hset", 1, emq_str.state, emq_str.pending);
        }
    }
}

static void reply_ids(Sweep *s, int dead) {
    long n = 0;
    for (size_t i = 0; i < s->count; i++) n += s->jobs[i].dead == dead;
    RedisModule_ReplyWithArray(s->ctx, n);
    for (size_t i = 0; i < s->count; i++)
        if (s->jobs[i].dead == dead) RedisModule_ReplyWithString(s->ctx, s->jobs[i].id);
}

int EmqSweep_RedisCommand(RedisModuleCtx *ctx, RedisModuleString **argv, int argc) {
    /* parse */
    if (argc != 7) return RedisModule_WrongArity(ctx);
    static const char *const suffix[] = {"active", "pending", "dead"};
    int err = emq_check_queue_keys(&argv[1], suffix, 3, argv[4], EMQ_ERR_THREE_SETS);
    long long max_stalled = 0, limit = 0;
    size_t max_len, limit_len;
    const char *max_arg = RedisModule_StringPtrLen(argv[5], &max_len);
    const char *limit_arg = RedisModule_StringPtrLen(argv[6], &limit_len);
    if (!err) err = emq_parse_count(EMQ_COUNT_MAX_STALLED, max_arg, max_len, &max_stalled);
    if (!err) err = emq_parse_count(EMQ_COUNT_LIMIT, limit_arg, limit_len, &limit);
    if (!err && limit > emq_config_max_limit()) err = EMQ_ERR_LIMIT_TOO_LARGE;
    if (!err) err = emq_check_cluster_base(ctx, argv[4]);
    if (err) return emq_reply_error(ctx, err);
    long long now = RedisModule_Milliseconds();

    /* open and type-check */
    Sweep s = {.ctx = ctx, .base = argv[4]};
    const int rw = REDISMODULE_READ | REDISMODULE_WRITE;
    emq_key_open(ctx, &s.active, argv[1], rw);
    emq_key_open(ctx, &s.pending, argv[2], rw);
    emq_key_open(ctx, &s.dead, argv[3], rw);
    EmqFx fx;
    emq_fx_begin(&fx, ctx);
    if (!emq_type_ok(&s.active, REDISMODULE_KEYTYPE_ZSET) || !emq_type_ok(&s.pending, REDISMODULE_KEYTYPE_ZSET) ||
        !emq_type_ok(&s.dead, REDISMODULE_KEYTYPE_ZSET)) {
        emq_reply_error(ctx, EMQ_ERR_WRONGTYPE);
        goto done;
    }

    /* read and decide */
    sweep_collect(&s, now, limit);
    err = emq_acl_user(ctx, &s.user) ? sweep_decide(&s, max_stalled) : EMQ_ERR_NOPERM_DERIVED;
    if (err) {
        emq_reply_error(ctx, err);
        goto done;
    }

    /* apply and reply */
    sweep_apply(&s, &fx);
    RedisModule_ReplyWithArray(ctx, 2);
    reply_ids(&s, 0);
    reply_ids(&s, 1);

done:
    emq_fx_commit(&fx);
    sweep_release(&s);
    return REDISMODULE_OK;
}
