/* emq.h -- what every command file of emq.so shares.
 *
 * The module in one paragraph: a queue named Q lives under the base
 * "emq:{Q}:".  Two facts carry the design.  The lease IS the active set's
 * score: <base>active holds each running job's id scored with its deadline
 * in server milliseconds; there is no lock key.  The fencing token IS the
 * job row's `token`, fresh for every claim ("<attempts>-<random>"), so a
 * holder from an earlier claim -- even one a failover made the server
 * forget -- can never touch the job again.
 *
 * Files, by concept:
 *   emq.c          loading, the one command table (with each command's
 *                  metadata), the strings made at load
 *   emq_meta.c/.h  a table row told to the server: arity, key specs, docs,
 *                  ACL categories
 *   emq_config.c/.h  the operator's ceilings (emq.max-limit, ...): module
 *                  configs, load arguments, the accessors the verbs call
 *   emq_enqueue.c  ENQUEUE, ENQUEUEMANY    (jobs enter the queue, now or at a due time)
 *   emq_claim.c    CLAIM                   (a worker takes jobs, with fresh tokens; BLOCK waits)
 *   emq_lease.c    EXTEND, CHECKPOINT      (a holder keeps its lease)
 *   emq_finish.c   COMPLETE, FAIL, RELEASE (a holder ends its hold)
 *   emq_sweep.c    SWEEP                   (lapsed leases: recover or dead-letter)
 *   emq_cancel.c   CANCEL                  (a cancel request, delivered by CHECKPOINT)
 *   emq_dead.c     RETRY, RETRYDEAD, PURGE (the operator and the dead letters)
 *   emq_admin.c    RETENTION, PAUSE, RESUME, OBLITERATE, FORGET (a queue's settings and end)
 *   emq_core.c     the decisions, pure C: parsing, deadlines, transitions, error texts
 *   emq_effects.c  every write: the change, its keyspace event, its replication
 *   emq_keys.c     a queue's keys: checks, derived names, ACL, opening, the fence
 *   emq_lanes.c    where a job waits: <pending>, <base>priority, <base>delayed;
 *                  a claim's choice, promotion, tombstones
 *   emq_row.c      what a row holds: values in 64-byte pieces, the level
 *   emq_end.c      the two hooks: a job leaves <active>, a job ends
 *   emq_group.c    groups: a job's group and its exact count of active jobs
 *   emq_unique.c   unique jobs: ENQUEUE's UNIQUE key, released when its job ends
 *   emq_registry.c the queue registry: <base>queue, made by the first enqueue
 *   emq_wake.c     claims that wait on a queue's lanes, and what wakes them
 *   emq_schedules.c/.h  the server fires due schedule ticks itself: the
 *                  index of schedule sets, the timer, the fire
 *   emq_rm.c/.h    our own declaration of the module API we call
 *
 * Every handler runs in the same order: parse -> open and type-check ->
 * read -> decide (emq_core) -> apply (emq_effects) -> reply. */
#ifndef EMQ_H
#define EMQ_H

#include "emq_config.h"
#include "emq_core.h"
#include "emq_deps.h"
#include "emq_effects.h"
#include "emq_end.h"
#include "emq_flow.h"
#include "emq_group.h"
#include "emq_keys.h"
#include "emq_lanes.h"
#include "emq_rm.h"
#include "emq_row.h"
#include "emq_registry.h"
#include "emq_unique.h"
#include "emq_wake.h"

/* Field names, state values and small numbers, made once at load (a
 * C-string field costs an allocation per use, and in a 100,000-job sweep
 * those were a sixth of the command's instructions).  Owned by emq.c. */
#define EMQ_STRINGS(X)                        \
    X(attempts, "attempts")                   \
    X(tries, "tries")                         \
    X(token, "token")                         \
    X(closed_by, "closed_by")                 \
    X(claimed_at, "claimed_at")               \
    X(finished_at, "finished_at")             \
    X(retries, "retries")                     \
    X(checkpoint, "checkpoint")               \
    X(checkpoint_at, "checkpoint_at")         \
    X(checkpoint_attempt, "checkpoint_attempt") \
    X(paused, "paused")                       \
    X(done_ttl_ms, "done_ttl_ms")             \
    X(cancelled_ttl_ms, "cancelled_ttl_ms")   \
    X(dead_ttl_ms, "dead_ttl_ms")             \
    X(complete, "complete")                   \
    X(fail_pending, "fail:pending")           \
    X(fail_dead, "fail:dead")                 \
    X(fail_cancelled, "fail:cancelled")       \
    X(release_pending, "release:pending")     \
    X(release_cancelled, "release:cancelled") \
    X(stalled, "stalled")                     \
    X(state, "state")                         \
    X(last_error, "last_error")               \
    X(payload, "payload")                     \
    X(result, "result")                       \
    X(traceback, "traceback")                 \
    X(progress, "progress")                   \
    X(priority, "priority")                   \
    X(unique, "unique")                       \
    X(group, "group")                         \
    X(ring, "ring")                           \
    X(max, "max")                             \
    X(group_max, "group_max")                 \
    X(empty, "")                              \
    X(stale, "stale")                         \
    X(seq, "seq")                             \
    X(rate_max, "max")                        \
    X(rate_per_ms, "per_ms")                  \
    X(rate_window, "window")                  \
    X(rate_used, "used")                      \
    X(backoff_until, "backoff_until")         \
    X(enqueued_at, "enqueued_at")             \
    X(cancel_requested, "cancel_requested")   \
    X(count, "count")                         \
    X(pending, "pending")                     \
    X(active, "active")                       \
    X(done, "done")                           \
    X(dead, "dead")                           \
    X(cancelled, "cancelled")                 \
    X(waiting, "waiting")                     \
    X(deleted, "deleted")                     \
    X(missing, "missing")                     \
    X(waits, "waits")                         \
    X(after, "after")                         \
    X(waiters, "waiters")                     \
    X(deps, "deps")                           \
    X(due, "due")                             \
    X(on_failure, "on_failure")               \
    X(one, "1")                               \
    X(xx, "XX")                               \
    X(pxat, "PXAT")                           \
    X(acl_hget, "HGET")                       \
    X(acl_hset, "HSET")                       \
    X(acl_get, "GET")                         \
    X(acl_set, "SET")                         \
    X(acl_del, "DEL")                         \
    X(acl_zscore, "ZSCORE")                   \
    X(acl_zadd, "ZADD")

#define EMQ_STRING_FIELD(name, text) RedisModuleString *name;
typedef struct {
    EMQ_STRINGS(EMQ_STRING_FIELD)
} EmqStrings;
#undef EMQ_STRING_FIELD

extern EmqStrings emq_str;

/* "0" .. "63", for stall counts and other small values. */
#define EMQ_SMALL_INTS 64
extern RedisModuleString *emq_small_int[EMQ_SMALL_INTS];

/* The command handlers, one per verb; emq.c registers them. */
int EmqExtend_RedisCommand(RedisModuleCtx *ctx, RedisModuleString **argv, int argc);
int EmqCheckpoint_RedisCommand(RedisModuleCtx *ctx, RedisModuleString **argv, int argc);
int EmqSweep_RedisCommand(RedisModuleCtx *ctx, RedisModuleString **argv, int argc);
int EmqEnqueue_RedisCommand(RedisModuleCtx *ctx, RedisModuleString **argv, int argc);
int EmqEnqueueMany_RedisCommand(RedisModuleCtx *ctx, RedisModuleString **argv, int argc);
int EmqClaim_RedisCommand(RedisModuleCtx *ctx, RedisModuleString **argv, int argc);
int EmqComplete_RedisCommand(RedisModuleCtx *ctx, RedisModuleString **argv, int argc);
int EmqFail_RedisCommand(RedisModuleCtx *ctx, RedisModuleString **argv, int argc);
int EmqRelease_RedisCommand(RedisModuleCtx *ctx, RedisModuleString **argv, int argc);
int EmqCancel_RedisCommand(RedisModuleCtx *ctx, RedisModuleString **argv, int argc);
int EmqRetry_RedisCommand(RedisModuleCtx *ctx, RedisModuleString **argv, int argc);
int EmqRetryDead_RedisCommand(RedisModuleCtx *ctx, RedisModuleString **argv, int argc);
int EmqPurge_RedisCommand(RedisModuleCtx *ctx, RedisModuleString **argv, int argc);
int EmqRetention_RedisCommand(RedisModuleCtx *ctx, RedisModuleString **argv, int argc);
int EmqPause_RedisCommand(RedisModuleCtx *ctx, RedisModuleString **argv, int argc);
int EmqGroupLimit_RedisCommand(RedisModuleCtx *ctx, RedisModuleString **argv, int argc);
int EmqResume_RedisCommand(RedisModuleCtx *ctx, RedisModuleString **argv, int argc);
int EmqObliterate_RedisCommand(RedisModuleCtx *ctx, RedisModuleString **argv, int argc);
int EmqForget_RedisCommand(RedisModuleCtx *ctx, RedisModuleString **argv, int argc);

int EmqCompleteClaim_RedisCommand(RedisModuleCtx *ctx, RedisModuleString **argv, int argc);

/* COMPLETE's steps (emq_finish.c), which EMQ.COMPLETECLAIM (emq_claim.c)
 * runs before its claim: check the arguments (and RESULT's size, against
 * emq.max-result-bytes); open, read and decide (an error: nothing may be
 * written; c->reply is :1 or :-1, c->write whether apply writes); apply;
 * close (always, after prepare). */
typedef struct {
    EmqKey active, row;
    RedisModuleUser *user;
    RedisModuleString *base;   /* made by prepare, freed by close */
    RedisModuleString *result; /* borrowed: RESULT's bytes, or NULL */
    EmqMeta meta;
    EmqEnd end;
    int reply, write;
} EmqCompleting;
int emq_complete_check(RedisModuleString *active, RedisModuleString *job, RedisModuleString *id);
int emq_check_result(RedisModuleString *result);
int emq_complete_prepare(RedisModuleCtx *ctx, EmqCompleting *c, RedisModuleString *active, RedisModuleString *job,
                         RedisModuleString *id, RedisModuleString *token, RedisModuleString *result);
void emq_complete_apply(EmqFx *fx, EmqCompleting *c, RedisModuleString *id, long long now);
void emq_complete_close(EmqCompleting *c);

/* [RESULT <bytes>] of COMPLETE and COMPLETECLAIM, from argv[from] on: the
 * bytes (or NULL), checked against emq.max-result-bytes, and against
 * maxmemory where `oom_check` (COMPLETE is not deny-oom). */
int emq_parse_result(RedisModuleCtx *ctx, RedisModuleString **argv, int from, int argc, int oom_check,
                     RedisModuleString **result);

/* Answer an error from the core's table. */
int emq_reply_error(RedisModuleCtx *ctx, int err);

#endif
