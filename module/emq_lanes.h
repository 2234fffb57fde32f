/* emq_lanes.h -- where a job waits until a claim takes it.
 *
 * A claimable job waits in a lane: priority 0 (the default) in <pending>, a
 * list; any other level in <base>priority, a sorted set scored
 * (level + 1024) * 2^42 + seq.  A job that is not due yet waits in
 * <base>delayed, scored with its due time, and enters its lane's tail when
 * it comes due (promotion: CLAIM, COMPLETECLAIM and SWEEP move up to
 * EMQ_PROMOTE_MAX due members per call).  A list entry costs the id and two
 * bytes, a sorted-set member ~137 bytes on Redis 7.0: the common case --
 * no priority, no delay -- pays for a list only.
 *
 * A due job of a group <g> (ENQUEUE ... GROUP) waits in its group's own
 * lane, <base>g:<g>, scored as <base>priority whatever its level (below: a
 * lane per group, and the ring a claim rotates through).
 *
 * A job enters a lane at its tail (a new turn: ENQUEUE, FAIL, RETRY, a
 * promotion; the next `seq` of <base>meta in <base>priority) or at its head
 * (given back: RELEASE, SWEEP's recoveries).  The head is one rule at every
 * level: before every job waiting there, the jobs of a later call before
 * those of an earlier one, one call's in its order -- LPUSH of the call's
 * ids reversed at level 0, seqs below the level's first job in
 * <base>priority (emq_head_seq, settled when the call applies: the one read
 * of the apply, before its first write).
 *
 * Tombstones.  Removing an id from the middle of a list is O(n), so CANCEL
 * of a job waiting in <pending> leaves its entry and counts it in
 * <base>meta's `stale`; a claim drops such entries as it meets them (at most
 * EMQ_DROP_MAX per call) and counts them off.  An entry is live when its
 * row exists, says pending, has no priority and is not delayed
 * (emq_entry_live); `stale` = LLEN(<pending>) - the pending jobs that wait
 * in it, under every verb.  No verb leaves a member of <base>priority
 * without a pending row, but one written by hand is dropped by the claim
 * that meets it (emq_member_live; within the same EMQ_DROP_MAX), never
 * claimed: it has no payload to run.
 *
 * A verb decides first (emq_lanes_place, _delay, _remove, _promote: the
 * keys opened and checked, the rows read, nothing written) and writes last,
 * in one order every verb and the Lua twin share (emq_lanes_apply):
 *   ZREM <base>delayed, RPUSH <pending>, LPUSH <pending>, ZADD <base>priority,
 *   ZADD <base>delayed, LPOP <pending>, ZREM <base>priority,
 *   then per group lane met: ZADD, ZREM; then the ring: LPOP, RPUSH (or DEL),
 *   HSET/HDEL <base>meta ring; then per group: HSET/HDEL <base>group:<g> ring;
 *   then each group its cap or pause kept out of the ring, settled as it
 *   stands (emq_group_settle); HSET <base>meta
 * each one command, skipped when it has nothing to do. */
#ifndef EMQ_LANES_H
#define EMQ_LANES_H

#include "emq_effects.h"
#include "emq_rm.h"

/* A growing array of ids, each retained. */
typedef struct {
    RedisModuleString **ids;
    long long *scores;
    long n, cap;
} EmqIds;

void emq_ids_add(EmqIds *a, RedisModuleString *id, long long score);
void emq_ids_free(EmqIds *a);

/* Order the ids by their scores (all different). */
void emq_sort_scored(EmqIds *a);

/* Which derived keys a verb opens (emq_lanes_open). */
#define EMQ_LANE_PRIORITY 1
#define EMQ_LANE_DELAYED 2
#define EMQ_LANE_META 4
#define EMQ_LANE_ALL (EMQ_LANE_PRIORITY | EMQ_LANE_DELAYED | EMQ_LANE_META)

/* Where emq_lanes_place puts a job. */
enum { EMQ_AT_TAIL, EMQ_AT_HEAD };

/* A group's own lane, <base>g:<g> (issue 45): scored as <base>priority, it
 * holds the group's due jobs.  <base>groups, a list, is the ring of the
 * groups a claim rotates through; `ring` 1 in <base>group:<g> says the group
 * is in it (never added twice).  The ring, while it exists, also holds the
 * empty name once: the queue's ungrouped lanes, one more member. */
typedef struct {
    RedisModuleString *group; /* retained */
    RedisModuleString *lane_name, *hash_name;
    EmqKey lane;
    long card;
    int in_ring, enters, leaves;
    int held;                  /* would have entered the ring but its cap or pause kept it out: settled at apply */
    int paused;                /* <base>group:<g>'s `paused` (EMQ.GROUPLIMIT ... PAUSE) */
    long long active, cap;     /* its `active` as read, its `max` (EMQ_NO_CAP: none) */
    long took;                 /* a claim: the group's jobs it took */
    EmqIds add, leave, heads; /* heads: scored with the level until settled */
    EmqIds promoted;          /* a claim: promoted into it in this call (scores) */
    long taken, promoted_next; /* a claim: stored members read, promoted ones taken */
    double last_score;         /* a claim: the last stored member read */
} EmqGroupLane;

typedef struct {
    RedisModuleCtx *ctx;
    RedisModuleUser *user;   /* borrowed; NULL: nothing to check */
    RedisModuleString *base; /* borrowed */
    EmqKey *pending;         /* borrowed: the verb's <pending>, open for writing */
    EmqKey priority, delayed, meta;
    RedisModuleString *priority_name, *delayed_name, *meta_name;
    int opened;                /* EMQ_LANE_* bits */
    long long seq, stale;      /* <base>meta's counters as this call leaves them */
    int seq_changed, stale_changed;
    long priority_card;        /* ZCARD <base>priority when opened */
    /* the writes, in emq_lanes_apply's order */
    EmqIds leave_delayed, tails, heads, priority_add, delayed_add, leave_priority;
    EmqIds priority_heads; /* put back at a level other than 0, scored with the level until settled */
    long pops;
    /* what a promotion moved, for a claim that takes from it in the same call */
    EmqIds promoted_tails, promoted_priority;
    long promoted, dropped;
    /* reading <pending> without ListGet (Redis 6.2): a window of LRANGE */
    RedisModuleString **window;
    long window_from, window_n;
    /* groups: their lanes (in the order met) and the ring */
    EmqGroupLane *gl;
    long ngl, capgl;
    RedisModuleDict *gl_index; /* group name -> index + 1 */
    EmqKey ring;
    RedisModuleString *ring_name;
    int ring_opened, meta_ring; /* meta_ring: <base>meta's `ring` (the ring exists) as read */
    long ring_len;  /* LLEN <base>groups when opened */
    long ring_pops; /* a claim: members read from the ring's head */
    int ring_popped_empty;
    EmqIds ring_push; /* names pushed at the ring's tail, from ring_push_from on */
    long ring_push_from;
} EmqLanes;

void emq_lanes_init(EmqLanes *l, RedisModuleCtx *ctx, RedisModuleUser *user, RedisModuleString *base,
                    EmqKey *pending);
void emq_lanes_close(EmqLanes *l);

/* Open the derived keys `which` names that are not open yet: the caller's
 * ACL on each first, then its type (a sorted set, <base>meta a hash), and
 * <base>meta's counters read.  EMQ_OK or the error. */
int emq_lanes_open(EmqLanes *l, int which);

/* A job enters its lane: at the tail (a new turn) or the head (given
 * back).  Level 0 is <pending>; any other <base>priority, at the next seq
 * (tail) or below the level's first job (head). */
int emq_lanes_place(EmqLanes *l, RedisModuleString *id, long long level, int end);

/* The same for a job of `group` (NULL: emq_lanes_place): its group's lane,
 * at the tail (the next seq, above every seq of that level in the lane) or
 * the head; a group not in the ring enters it -- unless it is paused or at
 * its cap (then the call settles it at apply, when a job of it that leaves
 * <active> in the same call has left). */
int emq_lanes_place_in(EmqLanes *l, RedisModuleString *id, RedisModuleString *group, long long level, int end);

/* Open `group`'s lane (and the ring) once per call: *at its index in l->gl. */
int emq_lanes_group(EmqLanes *l, RedisModuleString *group, long *at);

/* The group enters the ring's tail (pushed at apply) unless it is in it,
 * paused or at its cap (then `held`: settled at apply). */
void emq_lanes_ring_enter(EmqLanes *l, EmqGroupLane *g);

/* Open the ring: l->ring_len. */
int emq_lanes_open_ring(EmqLanes *l);

/* The ring's member at `index` as stored (a new string), or NULL. */
RedisModuleString *emq_lanes_ring_at(EmqLanes *l, long index);

/* A job's group as its row names it (a new string), or NULL. */
RedisModuleString *emq_row_group(EmqKey *row);

/* place_in / enter_in / remove_in with the level and the group the job's
 * row (open, a hash) names. */
int emq_lanes_place_row(EmqLanes *l, RedisModuleString *id, EmqKey *row, int end);
int emq_lanes_enter_row(EmqLanes *l, RedisModuleString *id, EmqKey *row, long long due, long long now);
int emq_lanes_remove_row(EmqLanes *l, RedisModuleString *id, EmqKey *row);

/* A job waits in <base>delayed until `due`. */
int emq_lanes_delay(EmqLanes *l, RedisModuleString *id, long long due);

/* A job becomes claimable at `due`: due now, at its lane's tail; due later,
 * or already past (an AT before now), in <base>delayed, scored with it, so
 * that the claim or sweep that moves it takes the due jobs oldest due time
 * first: jobs enqueued with past due times are claimed in the order of
 * those times (within a level), not in the order they were enqueued. */
int emq_lanes_enter(EmqLanes *l, RedisModuleString *id, long long level, long long due, long long now);
int emq_lanes_enter_in(EmqLanes *l, RedisModuleString *id, RedisModuleString *group, long long level, long long due,
                       long long now);

/* A waiting job leaves (CANCEL): out of <base>delayed when it is there,
 * else out of <base>priority (level != 0), else its <pending> entry becomes
 * a tombstone (`stale` + 1). */
int emq_lanes_remove(EmqLanes *l, RedisModuleString *id, long long level);
/* The same for a job of `group` (NULL: emq_lanes_remove): out of
 * <base>delayed, else out of its group's lane (the group stays in the ring
 * until a claim finds its lane empty). */
int emq_lanes_remove_in(EmqLanes *l, RedisModuleString *id, RedisModuleString *group, long long level);

/* Move the due members of <base>delayed (score <= now, at most
 * EMQ_PROMOTE_MAX, in due order) to their lanes' tails.  Each row is read
 * (the caller's ACL for reading it first): a pending job goes to the lane
 * of its priority; a member whose row is gone or not pending only leaves
 * <base>delayed.  Opens what it needs.  EMQ_OK or the error. */
int emq_lanes_promote(EmqLanes *l, long long now);

/* 1 when <base>delayed still holds a member due at or before `now` (the
 * promotion bound left it), else 0; *next is then the earliest future due
 * time, or -1. */
int emq_lanes_due_left(EmqLanes *l, long long now, long long *next);

/* The entry at `index` of <pending> as it stands (nothing written yet), a
 * new string the caller frees, or NULL past its end. */
RedisModuleString *emq_lanes_entry(EmqLanes *l, long index);

/* 1 when `id` is a member of <base>delayed. */
int emq_lanes_is_delayed(EmqLanes *l, RedisModuleString *id);

/* Write what was decided, in the one order (above). */
void emq_lanes_apply(EmqLanes *l, EmqFx *fx);

#endif
