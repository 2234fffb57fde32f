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
    RedisModuleString *group; /* <g> (retained) */
    long long delta;
    int applied;
} EmqGroupDelta;

typedef struct {
    RedisModuleCtx *ctx;
    RedisModuleString *base; /* borrowed */
    RedisModuleUser *user;   /* borrowed, or loaded here when NULL (own_user) */
    int own_user, user_loaded;
    int defer_settle; /* left_apply settles nothing: emq_groups_settle_deferred does, later */
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

/* The settles left_apply deferred (defer_settle), in the order met. */
void emq_groups_settle_deferred(EmqGroups *g, EmqFx *fx);

/* Every claim's sum, in the order the groups were met. */
void emq_groups_claimed_apply(EmqGroups *g, EmqFx *fx);

/* Caps (EMQ.GROUPLIMIT, emq_grouplimit.c).  <base>group:<g>'s `max` caps
 * how many of the group's jobs may be active at once, across all workers;
 * `paused` holds all of them back.  Neither costs a claim anything: a
 * group is in the ring exactly when emq_group_claimable says so.  The claim
 * that takes a group's last slot leaves it out of the ring; a job of it
 * that leaves <active> settles it (below), as do EMQ.GROUPLIMIT and a job
 * that enters the lane of a group held out. */

/* A group hash's `active` (one a hand edit broke reads 0 here: the claim
 * and the hook refuse it) and its cap: its own `max`, else <base>meta's
 * `group_max` (the queue's default), else EMQ_NO_CAP; a bad `max` is
 * EMQ_ERR_GROUP_MAX_FIELD, a bad `group_max` EMQ_ERR_GROUP_DEFAULT_FIELD.
 * <base>meta is read without an ACL check: the caller checked it. */
int emq_group_default_cap(RedisModuleCtx *ctx, RedisModuleString *base, long long *cap);
int emq_group_caps_read(RedisModuleCtx *ctx, RedisModuleString *base, EmqKey *hash, long long *active,
                        long long *cap);

/* The group enters the ring's tail if it may (its lane holds a job, it is
 * not paused, it is below its cap) and is not in it, all read as they
 * stand when called (every earlier write of the call seen): RPUSH
 * <base>groups [""] <g>, HSET ring 1 on <base>group:<g> and on <base>meta;
 * the claims waiting on the queue look again.  `ring` the caller's open
 * handle of <base>groups, or NULL.  Writes only: the caller checked the
 * keys at prepare. */
void emq_group_settle(RedisModuleCtx *ctx, EmqFx *fx, RedisModuleString *base, RedisModuleString *group,
                      EmqKey *ring);

/* <base>groupset, the index of a queue's groups: a sorted set (every score
 * 0, so read in name order) of the groups whose hash <base>group:<g>
 * exists -- every group with a job waiting or active, a cap or a pause.
 * What lists the groups, counts their waiting jobs and obliterates them
 * reads it: a group out of the ring (capped, paused) is still found.  A
 * write that creates a group's hash or deletes it updates the index in
 * the same call (emq_group_index_sync: `existed` is whether the hash
 * existed before the write, `h` its handle after). */
int emq_group_index_check(RedisModuleCtx *ctx, RedisModuleUser *user, RedisModuleString *base);
void emq_group_index_sync(RedisModuleCtx *ctx, EmqFx *fx, RedisModuleString *base, RedisModuleString *group,
                          int existed, EmqKey *h);

/* The keys emq_group_settle touches besides the group's hash, checked for
 * the caller (ACL, type): the lane, the ring, <base>meta, the index. */
int emq_group_settle_check(RedisModuleCtx *ctx, RedisModuleUser *user, RedisModuleString *base,
                           RedisModuleString *group);

#endif
