/* emq_end.h -- the two hooks: a job leaves <active>, and a job ends.
 *
 * Features that keep state beside a job act on every path a job takes out
 * of <active> and out of the queue, or the state outlives the job (an
 * orphaned unique key, a group counter that never comes back down, a
 * waiter that waits forever).  Two hooks, called from every such path,
 * each a prepare/apply pair: prepare reads and checks (it may refuse:
 * nothing is written yet), apply writes -- so a verb still validates
 * everything before its first write.
 *
 *   left active  COMPLETE, COMPLETECLAIM, FAIL (every route), RELEASE,
 *                SWEEP (recovered, dead, cancelled), OBLITERATE ... FORCE
 *                of an active job
 *   ended        the job is done, dead or cancelled: COMPLETE,
 *                COMPLETECLAIM, FAIL to dead or cancelled, RELEASE to
 *                cancelled, CANCEL of a waiting job, SWEEP to dead or
 *                cancelled; or its row is deleted: OBLITERATE (jobs that had
 *                not ended), PURGE, FORGET and SWEEP's dead retention (rows
 *                of jobs that had: `already`).  A row expiring after its
 *                retention needs no hook: everything beside a job is
 *                settled when it ends, never when its row goes.
 *
 * The first step: a job that ends announces its id on <base>done:<id>
 * (SPUBLISH where the server has sharded pub/sub, so a cluster does not
 * broadcast it; PUBLISH on Redis 6.2).  A waiter subscribes, then reads the
 * row, then waits for the message: no polling.
 *
 * The second: a unique key the job holds is released (emq_unique.h).
 *
 * The third: the job's waiters are resolved, and a waiting job leaves the
 * waiter sets of what it waited for (emq_deps.h).
 *
 * Left active's one step: the job's group, if it has one, counts one
 * active job less (emq_group.h).
 *
 * Adding a step (unique keys, groups, dependencies): what its prepare reads
 * goes in EmqEnd, its checks in the prepare functions, its writes in the
 * apply functions (emq_end.c), each beside the steps already there. */
#ifndef EMQ_END_H
#define EMQ_END_H

#include "emq_effects.h"
#include "emq_group.h"
#include "emq_rm.h"

/* How a job ended, for the `ended` hook. */
typedef enum { EMQ_END_DONE, EMQ_END_DEAD, EMQ_END_CANCELLED, EMQ_END_DELETED } EmqEndHow;

typedef struct EmqUniqueEnd EmqUniqueEnd; /* emq_unique.c */
typedef struct EmqDepsEnd EmqDepsEnd;     /* emq_deps.c */

typedef struct {
    RedisModuleCtx *ctx;
    RedisModuleString *base; /* borrowed */
    EmqUniqueEnd *unique;    /* unique keys to release (emq_unique.c), NULL: none yet */
    EmqDepsEnd *deps;        /* waiters to resolve, sets to leave (emq_deps.c), NULL: none yet */
    EmqGroups groups;        /* the group counts the jobs leaving <active> take one off (emq_group.h) */
} EmqEnd;

void emq_end_init(EmqEnd *e, RedisModuleCtx *ctx, RedisModuleString *base);
void emq_end_close(EmqEnd *e);

/* The job `id` leaves <active> (whatever comes next for it).  `row` is its
 * row when the caller has it open (it is read, not written), else NULL:
 * opened here by name. */
int emq_left_active_prepare(EmqEnd *e, RedisModuleString *id, EmqKey *row);
void emq_left_active_apply(EmqEnd *e, EmqFx *fx, RedisModuleString *id);

/* The job `id` ends `how`; `already`: its row is deleted after the job
 * ended (PURGE, FORGET, the dead retention): only the deletion's steps
 * run. */
int emq_ended_prepare(EmqEnd *e, RedisModuleString *id, int how, int already);
/* The same, with the job's row when the caller has it open (read, not
 * written), else NULL: opened here by name; and `deps` 0 when the caller
 * read <base>meta and its `deps` is absent (the queue never had a
 * dependency: no row field of theirs is looked for), else 1.  Either way
 * the row is opened and read once for every step (one HashGet). */
int emq_ended_prepare_row(EmqEnd *e, RedisModuleString *id, int how, int already, EmqKey *row, int deps);
void emq_ended_apply(EmqEnd *e, EmqFx *fx, RedisModuleString *id, int how, int already);

#endif
