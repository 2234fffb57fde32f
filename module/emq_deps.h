/* emq_deps.h -- jobs that wait for other jobs: ENQUEUE ... [ON_PARENT_FAILURE
 * fail|ignore|continue] [MISSING done] AFTER <id> [<id> ...].
 *
 * A job enqueued AFTER jobs that have not ended is `waiting`: a row state
 * of its own, in no lane, so that no claim sees it or pays for it, and every
 * verb that checks for `pending` leaves it alone.  Beside it:
 *
 *   <base>deps:<id>     hash: each dependency -> `waiting` until it is
 *                       resolved, then how it ended (`done`, `dead`,
 *                       `cancelled`, `deleted`, or `missing` under MISSING
 *                       done); the row's `waits` counts the `waiting` ones.
 *                       Kept while the job runs (ctx.parents() reads it),
 *                       deleted when the job ends.
 *   <base>waiters:<id>  sorted set: the jobs waiting on <id> that it has not
 *                       resolved yet, scored with their enqueue time (ms),
 *                       so every backend resolves them in one order.
 *   <base>resolve       list: the ends not resolved yet, `<how>:<id>`.
 *
 * No deadlock.  The `ended` hook (emq_end.h) runs on every path a job ends
 * or its row is deleted; its step here pushes `<how>:<id>` to
 * <base>resolve atomically with the end when the job has waiters, and takes
 * the ending job out of the waiter sets of the dependencies it still waited
 * for.  The resolver (emq_deps_drain) pops entries and resolves at most
 * EMQ_DEPS_STEP waiters per command: run by the verb that ended the job,
 * by every ENQUEUE and by SWEEP, so an end with 10,000 waiters resolves in
 * bounded steps, none lost (the list is written with the end, and each
 * waiter's resolution is one atomic step that removes it from the set).
 * A waiter whose last dependency is resolved enters its lane as ENQUEUE
 * would have put it (its group, level, and DELAY/AT: a delayed job with
 * dependencies waits for both).  A dependency that ended dead, cancelled or
 * deleted fails its waiters under `fail` (the default: the waiter ends dead,
 * `last_error` `dependency <id> <how>`, and its own waiters resolve in turn,
 * the same bounded way), counts as met under `ignore` and `continue` (the
 * deps hash says which failed).  Cycles cannot be written: a dependency
 * must exist when the job is enqueued, and a job's dependencies are fixed
 * then. */
#ifndef EMQ_DEPS_H
#define EMQ_DEPS_H

#include "emq_effects.h"
#include "emq_end.h"
#include "emq_rm.h"

#define EMQ_DEPS_MAX 1000 /* dependencies per job */
#define EMQ_DEPS_STEP 100 /* waiters one command resolves */

enum { EMQ_POLICY_FAIL, EMQ_POLICY_IGNORE, EMQ_POLICY_CONTINUE };

/* AFTER's options as parsed. */
typedef struct {
    RedisModuleString **ids; /* borrowed from argv: AFTER's arguments, duplicates dropped */
    int n;
    int seen_after, seen_policy, seen_missing, policy, missing_done;
} EmqDepsOpts;

/* The option at argv[i] if it is ON_PARENT_FAILURE, MISSING or AFTER: how
 * many arguments it takes (AFTER takes the rest), *err set on a refusal; 0
 * when it is none of them.  `d` NULL (ENQUEUEMANY): each is refused. */
int emq_deps_option(EmqDepsOpts *d, RedisModuleString **argv, int i, int argc, int *err);

/* After the last option: ON_PARENT_FAILURE and MISSING need AFTER; the job
 * `id` is none of its dependencies. */
int emq_deps_options_check(EmqDepsOpts *d, RedisModuleString *id);
void emq_deps_opts_free(EmqDepsOpts *d);

/* What an enqueue finds. */
enum { EMQ_DEPS_NONE, EMQ_DEPS_MET, EMQ_DEPS_WAIT, EMQ_DEPS_DIES };

typedef struct {
    RedisModuleCtx *ctx;
    const EmqDepsOpts *opts;
    int verdict;
    int live;                     /* dependencies not ended yet */
    RedisModuleString **outcome;  /* per id: NULL (live) or how it ended (emq_str or owned) */
    RedisModuleString *reason;    /* DIES: `dependency <id> <how>` (owned) */
    RedisModuleString *missing;   /* the id refused as missing (borrowed) */
    EmqKey *waiters;              /* per id: its <base>waiters:<id>, open when live */
    RedisModuleString **names;
    EmqKey deps, dead, meta; /* meta: <base>meta, whose `deps` the first AFTER sets */
    RedisModuleString *deps_name, *dead_name, *meta_name;
} EmqDeps;

void emq_deps_init(EmqDeps *d, RedisModuleCtx *ctx, const EmqDepsOpts *opts);

/* Read every dependency's row (ACL: HGET) and decide: none given, all met,
 * wait (their waiter sets opened: ZADD), or dies at once (a dependency
 * failed under `fail`: <base>dead opened).  -ERR for a missing one without
 * MISSING done: EMQ_ERR_COUNT_ with d->missing set (emq_deps_reply_error). */
int emq_deps_decide(EmqDeps *d, RedisModuleUser *user, RedisModuleString *base, RedisModuleString *id);
int emq_deps_reply_error(RedisModuleCtx *ctx, EmqDeps *d, int err);

/* The fields a new row gets beyond ENQUEUE's: state (waiting or dead), and
 * `waits`, `due`, `on_failure` or `finished_at`, `last_error`.  Returns how
 * many pairs it wrote into fields/values (at most 4), and *state. */
int emq_deps_row_fields(EmqDeps *d, EmqFx *fx, long long now, long long due, int delayed,
                        RedisModuleString **fields, RedisModuleString **values, RedisModuleString **state);

/* The writes beside the row: the deps hash, each live dependency's waiter
 * set (and its row's `waiters` mark), or the dead set for a job that dies
 * at once. */
void emq_deps_apply(EmqDeps *d, EmqFx *fx, RedisModuleString *base, RedisModuleString *id, long long now);
void emq_deps_close(EmqDeps *d);

/* Resolve up to `budget` waiters from <base>resolve, as the caller (its ACL:
 * a key it may not touch stops the drain where it is, nothing half
 * written).  Its own effects, committed before it returns; called by a verb
 * after its own commit, with its keys closed. */
void emq_deps_drain(RedisModuleCtx *ctx, RedisModuleString *base, long budget);

/* -- the `ended` hook's step (emq_end.c) ---------------------------------- */
int emq_deps_end_prepare(EmqEnd *e, RedisModuleString *id, int how, int already, int has_deps, int has_waiters);
void emq_deps_end_apply(EmqEnd *e, EmqFx *fx, RedisModuleString *id, int how, int already);
/* Frees the step's state; when an end was pushed, drains (unless draining). */
void emq_deps_end_close(EmqEnd *e);

#endif
