/* emq_group.h -- groups (issue 45): a job's group and its active count.
 *
 * ENQUEUE ... GROUP <g> stores the name in the row's `group`.  The server
 * keeps, for every group, how many of its jobs are in <active>:
 * <base>group:<g>'s field `active`.  A claim adds the jobs it hands out;
 * the "left active" hook (emq_end.c) takes one off on every path out of
 * <active>.  The invariant, exact after every command: `active` equals the
 * number of the group's jobs in <active> (echomq.testing.queue_problems
 * recomputes it).
 *
 * Prepare checks (the caller's ACL for HGET and HSET, the key's type, the
 * stored count) and writes nothing; apply reads the count as it stands
 * then and writes it back, absolute: HSET <key> active <n>, or HDEL at 0,
 * so a group with nothing active leaves no key.  Reading at apply, not at
 * prepare, is what lets one command take a job of a group out of <active>
 * and put another in (COMPLETECLAIM, a SWEEP of several): each write sees
 * the one before.  The key is opened afresh at apply: a write through
 * another handle may have deleted the hash the prepare saw. */
#ifndef EMQ_GROUP_H
#define EMQ_GROUP_H

#include "emq_effects.h"
#include "emq_rm.h"

typedef struct {
    RedisModuleString *id;   /* the job leaving <active> (retained), or NULL: a claim's sum */
    RedisModuleString *name; /* <base>group:<g> */
    long long delta;
    int applied;
} EmqGroupDelta;

typedef struct {
    RedisModuleCtx *ctx;
    RedisModuleString *base; /* borrowed */
    RedisModuleUser *user;   /* borrowed, or loaded here when NULL (own_user) */
    int own_user, user_loaded;
    EmqGroupDelta *d;
    size_t n, cap, cursor; /* cursor: where the next left_apply looks first (the verbs apply in prepare order) */
    RedisModuleDict *sums; /* a claim's groups: name -> index + 1 in d, so a claim of 1,000 jobs stays O(n log n) */
} EmqGroups;

void emq_groups_init(EmqGroups *g, RedisModuleCtx *ctx, RedisModuleString *base, RedisModuleUser *user);
void emq_groups_close(EmqGroups *g);

/* A claim hands out the job whose row is open in `row`: +1 for its group,
 * if it has one (summed per group). */
int emq_groups_claimed(EmqGroups *g, EmqKey *row);

/* The job `id` leaves <active>: -1 for its group, if its row names one
 * (the row is the caller's, checked by it: `row` when it is open, else
 * NULL and opened here to read). */
int emq_groups_left_prepare(EmqGroups *g, RedisModuleString *id, EmqKey *open_row);
void emq_groups_left_apply(EmqGroups *g, EmqFx *fx, RedisModuleString *id);

/* Every claim's sum, in the order the groups were met. */
void emq_groups_claimed_apply(EmqGroups *g, EmqFx *fx);

#endif
