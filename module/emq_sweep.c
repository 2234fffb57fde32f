/* emq_sweep.c -- lapsed leases: EMQ.SWEEP recovers or dead-letters them.
 *
 * A job whose holder stopped checkpointing has a deadline in the past.  The
 * sweep takes such jobs, oldest deadline first, counts a stall on each row,
 * and sends each back to the head of its lane (before the jobs that waited
 * there, in deadline order) -- or, at <max-stalled> stalls, to the dead
 * set: a job that keeps killing its workers is poison.  First it moves the
 * due members of <base>delayed to their lanes, as a claim does.  A lapsed job
 * whose cancel was requested ends cancelled instead (its holder is gone; it
 * must not run again).  The sweep is also where the dead retention is kept:
 * dead rows older than it (when the queue sets one) leave <dead> with their
 * rows, at most <limit> per call.
 *
 * collect (the lapsed ids, bounded by <limit>) -> decide (read and check
 * every row first: a sweep applies to all its jobs or to none) -> apply. */
#include <math.h>
#include <string.h>

#include "emq.h"

/* ------------------------------------------------------------------------
 * EMQ.SWEEP <active> <pending> <dead> <base> <max-stalled> <limit>
 *
 * Reply: [recovered ids, dead ids, cancelled ids, dead rows expired], the
 * lists in processing order.
 * ------------------------------------------------------------------------ */

/* What the sweep does with a lapsed job (or, for EXPIRED, a dead one past
 * the dead retention). */
enum { SWEPT_RECOVERED, SWEPT_DEAD, SWEPT_CANCELLED, SWEPT_EXPIRED };

/* One job: its id, its row, and what the sweep decided for it. */
typedef struct {
    RedisModuleString *id;
    EmqKey row;
    long long stalled, level;
    int fate;
} SweptJob;

typedef struct {
    RedisModuleCtx *ctx;
    RedisModuleString *base;
    SweptJob *jobs;
    size_t count, cap, lapsed; /* jobs[0..lapsed) lapsed; the rest expired dead */
    EmqKey active, pending, dead, metrics;
    EmqMeta meta;
    long long failed; /* the metric's count after this sweep */
    RedisModuleUser *user; /* the caller, for the derived keys' ACL; NULL: no check */
    EmqLanes lanes;
    EmqEnd end;
} Sweep;

static void sweep_release(Sweep *s) {
    emq_lanes_close(&s->lanes);
    emq_end_close(&s->end);
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

/* Collect up to `limit` members of `set` scored at or before `until` and
 * name their rows.  The range iterator must be closed before the set is
 * modified, so the ids are copied out first. */
static void sweep_collect(Sweep *s, EmqKey *set, long long until, long long limit, int fate) {
    if (emq_key_empty(set)) return;
    size_t first = s->count;
    RedisModule_ZsetFirstInScoreRange(set->key, -HUGE_VAL, (double)until, 0, 0);
    while (!RedisModule_ZsetRangeEndReached(set->key) && (long long)(s->count - first) < limit) {
        if (s->count == s->cap) {
            s->cap = s->cap ? s->cap * 2 : 16;
            s->jobs = RedisModule_Realloc(s->jobs, s->cap * sizeof *s->jobs);
        }
        SweptJob *j = &s->jobs[s->count++];
        memset(j, 0, sizeof *j);
        double score;
        j->id = RedisModule_ZsetRangeCurrentElement(set->key, &score);
        j->row.name = emq_derived_key(s->ctx, s->base, "job:", j->id);
        j->fate = fate;
        RedisModule_ZsetRangeNext(set->key);
    }
    RedisModule_ZsetRangeStop(set->key);
}

/* What the sweep does to a row: a lapsed job's is read and changed; an
 * expired dead job's is deleted unread. */
static int sweep_access(const SweptJob *j) {
    return j->fate == SWEPT_EXPIRED ? EMQ_DERIVED_DELETE : EMQ_DERIVED_READ_WRITE;
}

/* Read every row the sweep will write and decide its fate.  Returns EMQ_OK
 * or the error to answer; nothing has been written either way. */
static int sweep_decide(Sweep *s, long long max_stalled) {
    /* Every row's ACL before any row is read: a refusal reveals nothing. */
    for (size_t i = 0; i < s->count; i++)
        if (!emq_acl_may(s->user, s->jobs[i].row.name, sweep_access(&s->jobs[i]))) return EMQ_ERR_NOPERM_DERIVED;

    long long deaths = 0;
    for (size_t i = 0; i < s->count; i++) {
        SweptJob *j = &s->jobs[i];
        /* NULL user: the ACL of every row was checked above, once is enough. */
        int err = emq_open_derived(s->ctx, NULL, &j->row, j->row.name, sweep_access(j));
        if (err) return err;
        if (!emq_type_ok(&j->row, REDISMODULE_KEYTYPE_HASH)) return EMQ_ERR_WRONGTYPE;
        if (j->fate == SWEPT_EXPIRED) {
            err = emq_ended_prepare(&s->end, j->id, EMQ_END_DELETED, 1);
            if (err) return err;
            continue;
        }
        err = emq_left_active_prepare(&s->end, j->id, &j->row);
        if (err) return err;
        if (emq_hexists(&j->row, emq_str.cancel_requested)) {
            j->fate = SWEPT_CANCELLED;
            err = emq_ended_prepare(&s->end, j->id, EMQ_END_CANCELLED, 0);
            if (err) return err;
            continue;
        }
        /* A row that vanished while its id stayed active is re-created by the
         * stall count, as HINCRBY would: the id is not silently dropped. */
        err = emq_hash_incr(&j->row, emq_str.stalled, 1, EMQ_ERR_STALLED_NOT_INTEGER, &j->stalled);
        if (err) return err;
        j->fate = emq_stall_is_dead(j->stalled, max_stalled) ? SWEPT_DEAD : SWEPT_RECOVERED;
        deaths += j->fate == SWEPT_DEAD;
        if (j->fate == SWEPT_DEAD) err = emq_ended_prepare(&s->end, j->id, EMQ_END_DEAD, 0);
        /* Back to the head of its lane, in deadline order. */
        if (j->fate == SWEPT_RECOVERED) err = emq_lanes_place_row(&s->lanes, j->id, &j->row, EMQ_AT_HEAD);
        if (err) return err;
    }
    if (deaths == 0) return EMQ_OK;

    RedisModuleString *metrics_name = emq_derived_key(s->ctx, s->base, "metrics:failed", NULL);
    int err = emq_open_derived(s->ctx, s->user, &s->metrics, metrics_name, EMQ_DERIVED_READ_WRITE);
    if (err) return err;
    if (!emq_type_ok(&s->metrics, REDISMODULE_KEYTYPE_HASH)) return EMQ_ERR_WRONGTYPE;
    err = emq_hash_incr(&s->metrics, emq_str.count, deaths, EMQ_ERR_FAILED_NOT_INTEGER, &s->failed);
    s->failed -= deaths; /* counted up again, one per death, as the jobs die */
    return err;
}

/* Apply the decisions, job by job, in the order of the seed's Lua: the
 * keyspace events then come in the sequence its consumers know. */
static void sweep_apply(Sweep *s, EmqFx *fx, long long now) {
    for (size_t i = 0; i < s->count; i++) {
        SweptJob *j = &s->jobs[i];
        if (j->fate == SWEPT_EXPIRED) {
            emq_fx_zrem(fx, &s->dead, j->id);
            emq_fx_del(fx, &j->row);
            emq_ended_apply(&s->end, fx, j->id, EMQ_END_DELETED, 1);
            continue;
        }
        emq_fx_zrem(fx, &s->active, j->id);
        emq_left_active_apply(&s->end, fx, j->id);
        if (j->fate == SWEPT_CANCELLED) {
            emq_fx_hset(fx, &j->row, "hset", 2, emq_str.state, emq_str.cancelled, emq_str.finished_at,
                        emq_fx_number(fx, now));
            emq_ended_apply(&s->end, fx, j->id, EMQ_END_CANCELLED, 0);
            emq_fx_retain(fx, &j->row, now, s->meta.cancelled_ttl);
            continue;
        }
        emq_fx_hset(fx, &j->row, "hincrby", 1, emq_str.stalled, emq_fx_number(fx, j->stalled));
        if (j->fate == SWEPT_DEAD) {
            emq_fx_hset(fx, &j->row, "hset", 1, emq_str.state, emq_str.dead);
            emq_fx_hset(fx, &j->row, "hset", 2, emq_str.last_error, emq_str.stalled, emq_str.finished_at,
                        emq_fx_number(fx, now));
            emq_fx_zadd(fx, &s->dead, now, j->id, 0);
            emq_fx_hset(fx, &s->metrics, "hincrby", 1, emq_str.count, emq_fx_number(fx, ++s->failed));
            emq_ended_apply(&s->end, fx, j->id, EMQ_END_DEAD, 0);
        } else {
            emq_fx_hset(fx, &j->row, "hset", 1, emq_str.state, emq_str.pending);
        }
    }
    /* The lanes last: the promotion, and the recovered at their heads. */
    emq_lanes_apply(&s->lanes, fx);
}

static void reply_ids(Sweep *s, int fate) {
    long n = 0;
    for (size_t i = 0; i < s->count; i++) n += s->jobs[i].fate == fate;
    RedisModule_ReplyWithArray(s->ctx, n);
    for (size_t i = 0; i < s->count; i++)
        if (s->jobs[i].fate == fate) RedisModule_ReplyWithString(s->ctx, s->jobs[i].id);
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
    if (!err) err = emq_parse_limit(limit_arg, limit_len, emq_config_max_limit(), &limit);
    if (!err) err = emq_check_cluster_base(ctx, argv[4]);
    if (err) return emq_reply_error(ctx, err);
    long long now = RedisModule_Milliseconds();

    /* open and type-check (an absent declared key vouches for the slot: emq_keys.h) */
    int vouched = emq_slot_vouched_begin(ctx, argv + 1, 4);
    Sweep s = {.ctx = ctx, .base = argv[4]};
    const int rw = REDISMODULE_READ | REDISMODULE_WRITE;
    emq_key_open(ctx, &s.active, argv[1], rw);
    emq_key_open(ctx, &s.pending, argv[2], rw);
    emq_key_open(ctx, &s.dead, argv[3], rw);
    emq_lanes_init(&s.lanes, ctx, NULL, argv[4], &s.pending);
    emq_end_init(&s.end, ctx, argv[4]);
    EmqFx fx;
    emq_fx_begin(&fx, ctx);
    if (!emq_type_ok(&s.active, REDISMODULE_KEYTYPE_ZSET) || !emq_type_ok(&s.pending, REDISMODULE_KEYTYPE_LIST) ||
        !emq_type_ok(&s.dead, REDISMODULE_KEYTYPE_ZSET)) {
        emq_reply_error(ctx, EMQ_ERR_WRONGTYPE);
        goto done;
    }

    /* read and decide */
    err = emq_acl_user(ctx, &s.user) ? emq_read_meta(ctx, s.user, s.base, &s.meta) : EMQ_ERR_NOPERM_DERIVED;
    s.lanes.user = s.user;
    if (!err) err = emq_lanes_promote(&s.lanes, now);
    if (!err) {
        sweep_collect(&s, &s.active, now, limit, SWEPT_RECOVERED);
        s.lapsed = s.count;
        /* The expired dead share <limit> with the lapsed: one call never
         * takes more than <limit> jobs in all. */
        long long room = limit - (long long)s.lapsed;
        if (room > 0 && s.meta.dead_ttl >= 0 && now - s.meta.dead_ttl >= 0)
            sweep_collect(&s, &s.dead, now - s.meta.dead_ttl, room, SWEPT_EXPIRED);
        err = sweep_decide(&s, max_stalled);
    }
    if (err) {
        emq_reply_error(ctx, err);
        goto done;
    }

    /* apply and reply */
    sweep_apply(&s, &fx, now);
    RedisModule_ReplyWithArray(ctx, 4);
    reply_ids(&s, SWEPT_RECOVERED);
    reply_ids(&s, SWEPT_DEAD);
    reply_ids(&s, SWEPT_CANCELLED);
    RedisModule_ReplyWithLongLong(ctx, (long long)(s.count - s.lapsed));

done:
    emq_fx_commit(&fx);
    int requeued = s.pending.modified || s.lanes.priority.modified;
    sweep_release(&s);
    if (requeued) emq_signal_claimable(ctx, argv[2]);
    /* The ends not resolved yet (emq_deps.h): up to <limit> waiters. */
    if (!err) emq_deps_drain(ctx, argv[4], limit > EMQ_DEPS_STEP ? (long)limit : EMQ_DEPS_STEP);
    emq_slot_vouched_end(vouched);
    return REDISMODULE_OK;
}
