/* emq_claim.h -- what the two halves of a claim share: the claim being
 * decided (emq_claim.c: the verbs, their arguments, the write and the reply)
 * and the walk that decides which jobs it takes (emq_claim_walk.c: the
 * lanes, the ring of groups, tombstones and the fresh tokens). */
#ifndef EMQ_CLAIM_H
#define EMQ_CLAIM_H

#include "emq.h"

/* One claimed (or re-answered) job. */
typedef struct {
    RedisModuleString *id;
    RedisModuleString *row_name;
    EmqKey row;
    long long attempts, tries;
    char token[EMQ_TOKEN_MAX];
    int tokenlen;
} Claimed;

typedef struct {
    RedisModuleCtx *ctx;
    RedisModuleUser *user;
    RedisModuleString *base;
    Claimed *jobs;
    long n, cap;
    int reanswered; /* the jobs are a retry's: answered, never applied */
    int bound_hit;  /* EMQ_DROP_MAX tombstones dropped: the rest waits for the next call */
    EmqKey pending, own_active, record;
    EmqKey *active; /* own_active, or COMPLETECLAIM's (opened by its complete) */
    RedisModuleString *record_name;
    RedisModuleString *done; /* the job COMPLETECLAIM completes in this call, or NULL */
    EmqLanes lanes;
    EmqFlow flow; /* the queue's rate limit and back-off (emq_flow.h) */
    EmqGroups groups; /* the jobs taken, counted per group (emq_group.h) */
} Claim;

/* The next job slot of the claim (its jobs array allocated for `cap` the
 * first time), `id` kept (the claim's now) and its row's name made. */
Claimed *emq_claim_add_job(Claim *c, long cap, RedisModuleString *id);

/* Decide the claim: promote what is due, then take up to `count` jobs and
 * check every row before anything is written (emq_claim_walk.c). */
int emq_claim_collect(Claim *c, long long now, long count);

#endif
