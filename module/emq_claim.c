/* emq_claim.c -- a worker takes jobs: EMQ.CLAIM.
 *
 * CLAIM moves the next claimable jobs from their lanes (emq_lanes.h) to
 * <active>, leased until server-now + lease-ms, and gives each a fresh
 * fencing token: the row's `attempts` (every claim of the job, never
 * lowered) joined with 8 random bytes.  Per job it takes the head of
 * <base>priority when its level is below 0, else the next live entry of
 * <pending> (dropping tombstones), else the head of <base>priority: O(log n)
 * a job.  A queue with groups (<base>meta's `ring`: the ring <base>groups
 * exists) takes each job from the ring's head member instead, which moves
 * to the tail: the empty name for the ungrouped lanes (as above), any other
 * for its group's lane <base>g:<g>; a group leaves the ring with its lane's
 * last job, or when a claim finds its lane empty.  First it moves the due
 * members of <base>delayed to their lanes.  The counter alone would repeat after a failover that lost
 * the last claims; the random part does not (emq_core.h, emq_format_token).
 * The reply carries what a worker needs to start -- id, token, payload, the
 * attempt within its retry budget, the last checkpointed state -- so a job
 * costs one round trip to begin. */
#include <math.h>
#include <string.h>

#include "emq.h"

static const char *const PENDING_ACTIVE[] = {"pending", "active"};

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

static void claim_release(Claim *c) {
    for (long i = 0; i < c->n; i++) {
        emq_key_close(&c->jobs[i].row);
        RedisModule_FreeString(c->ctx, c->jobs[i].row_name);
        RedisModule_FreeString(c->ctx, c->jobs[i].id);
    }
    RedisModule_Free(c->jobs);
    emq_lanes_close(&c->lanes);
    emq_flow_close(&c->flow);
    emq_groups_close(&c->groups);
    emq_key_close(&c->record);
    if (c->record_name) RedisModule_FreeString(c->ctx, c->record_name);
    if (c->active == &c->own_active) emq_key_close(&c->own_active);
    emq_key_close(&c->pending);
    if (c->user) RedisModule_FreeModuleUser(c->user);
}

/* [id, token, payload, attempt, state]: the attempt is `tries` (this claim's
 * number within the job's retry budget), the state its last checkpoint's. */
static void reply_job(RedisModuleCtx *ctx, Claimed *j) {
    RedisModule_ReplyWithArray(ctx, 5);
    RedisModule_ReplyWithString(ctx, j->id);
    RedisModule_ReplyWithStringBuffer(ctx, j->token, (size_t)j->tokenlen);
    RedisModuleString *payload = emq_row_value(&j->row, EMQ_VALUE_PAYLOAD);
    if (payload) {
        RedisModule_ReplyWithString(ctx, payload);
        RedisModule_FreeString(NULL, payload);
    } else {
        RedisModule_ReplyWithStringBuffer(ctx, "", 0);
    }
    RedisModule_ReplyWithLongLong(ctx, j->tries);
    RedisModuleString *state = emq_hget(&j->row, emq_str.checkpoint);
    if (state) {
        RedisModule_ReplyWithString(ctx, state);
        RedisModule_FreeString(NULL, state);
    } else {
        RedisModule_ReplyWithNull(ctx);
    }
}

static void reply_jobs(Claim *c) {
    if (c->n == 0) {
        RedisModule_ReplyWithNull(c->ctx);
        return;
    }
    RedisModule_ReplyWithArray(c->ctx, c->n);
    for (long i = 0; i < c->n; i++) reply_job(c->ctx, &c->jobs[i]);
}

static Claimed *add_job(Claim *c, long cap, RedisModuleString *id) {
    if (c->jobs == NULL) {
        c->jobs = RedisModule_Alloc((size_t)cap * sizeof *c->jobs);
        c->cap = cap;
    }
    Claimed *j = &c->jobs[c->n++];
    memset(j, 0, sizeof *j);
    j->id = id;
    j->row_name = emq_derived_key(c->ctx, c->base, "job:", id);
    return j;
}

static long long field_ll(EmqKey *row, RedisModuleString *field, long long fallback) {
    RedisModuleString *v = emq_hget(row, field);
    long long out = fallback;
    if (v) {
        size_t len;
        const char *p = RedisModule_StringPtrLen(v, &len);
        if (emq_parse_ll(p, len, &out) != 0) out = fallback;
        RedisModule_FreeString(NULL, v);
    }
    return out;
}

/* A retry of a request whose claim went through: answer the jobs it took
 * that this request still holds (same token, still active); others were
 * lost since (their lease lapsed) and are left out.  `done` is the job
 * COMPLETECLAIM's complete half ends in this very call (NULL for CLAIM): no
 * longer held once the call applies, so never answered.  The record is
 * checked whole before anything is allocated for it; a malformed one (or
 * another call's) is an error.  Writes nothing. */
static int reanswer(Claim *c, const char *rec, size_t reclen, RedisModuleString *done) {
    long pairs;
    int err = emq_claim_record_check(rec, reclen, &pairs);
    if (err) return err;
    size_t pos = 0;
    for (long k = 0; k < pairs; k++) {
        const char *id, *tok;
        size_t idlen, toklen;
        emq_record_next(rec, reclen, &pos, &id, &idlen);
        emq_record_next(rec, reclen, &pos, &tok, &toklen);
        Claimed *j = add_job(c, pairs, RedisModule_CreateString(c->ctx, id, idlen));
        err = emq_open_derived(c->ctx, c->user, &j->row, j->row_name, EMQ_DERIVED_READ);
        if (err) return err;
        memcpy(j->token, tok, toklen);
        j->tokenlen = (int)toklen;
        RedisModuleString *current = emq_hget(&j->row, emq_str.token);
        size_t curlen = 0;
        const char *cur = current ? RedisModule_StringPtrLen(current, &curlen) : NULL;
        double score;
        int held = cur && curlen == toklen && memcmp(cur, tok, toklen) == 0 &&
                   RedisModule_ZsetScore(c->active->key, j->id, &score) == REDISMODULE_OK &&
                   !(done && emq_str_equal(done, j->id));
        if (current) RedisModule_FreeString(NULL, current);
        if (!held) {
            emq_key_close(&j->row);
            RedisModule_FreeString(c->ctx, j->row_name);
            RedisModule_FreeString(c->ctx, j->id);
            c->n--;
            continue;
        }
        j->tries = field_ll(&j->row, emq_str.tries, 0);
    }
    return EMQ_OK;
}

/* 1 when this claim took `id` already (an id in two places of a damaged
 * queue is taken once), or COMPLETECLAIM completes it: a tombstone of it
 * may wait in <pending> while it ran, and its row is open already. */
static int taken(Claim *c, RedisModuleString *id) {
    if (c->done && emq_str_equal(c->done, id)) return 1;
    for (long i = 0; i < c->n; i++)
        if (emq_str_equal(c->jobs[i].id, id)) return 1;
    return 0;
}

/* The random part of a fresh token: 8 bytes of the server's random stream,
 * drawn 64 tokens' worth at a time.  The server makes its random bytes 32 at
 * a time, an HMAC-SHA256 each, whatever was asked: 8 asked per token spent a
 * whole HMAC on each (12% of a CLAIM COUNT 1 under perf).  The pool is the
 * server's own stream read ahead, used once each, on the main thread only
 * (commands run there); a replica or an AOF gets the tokens written, never
 * draws its own. */
static const unsigned char *token_random(void) {
    static unsigned char pool[64 * 8];
    static size_t used = sizeof pool;
    if (used == sizeof pool) {
        RedisModule_GetRandomBytes(pool, sizeof pool);
        used = 0;
    }
    used += 8;
    return pool + used - 8;
}

/* The counters of a job taken: its row opened for writing (the caller's
 * ACL first), and the claim's number and the try's, as HINCRBY would make
 * them. */
static int count_claim(Claim *c, Claimed *j) {
    int err = EMQ_OK;
    if (j->row.key == NULL) err = emq_open_derived(c->ctx, c->user, &j->row, j->row_name, EMQ_DERIVED_READ_WRITE);
    if (!err && !emq_type_ok(&j->row, REDISMODULE_KEYTYPE_HASH)) err = EMQ_ERR_WRONGTYPE;
    if (!err) err = emq_hash_incr(&j->row, emq_str.attempts, 1, EMQ_ERR_ATTEMPTS_NOT_INTEGER, &j->attempts);
    if (!err) err = emq_hash_incr(&j->row, emq_str.tries, 1, EMQ_ERR_TRIES_NOT_INTEGER, &j->tries);
    if (err) return err;
    j->tokenlen = emq_format_token(j->attempts, token_random(), j->token);
    return EMQ_OK;
}

/* Take a job a promotion moved (`id` is ours): its row said pending. */
static int take(Claim *c, long count, RedisModuleString *id) {
    if (taken(c, id)) {
        RedisModule_FreeString(NULL, id);
        return EMQ_OK;
    }
    return count_claim(c, add_job(c, count, id));
}

/* A member of <base>priority (`id` is ours), which leaves it either way:
 * taken when its row exists and says pending (emq_member_live), else
 * dropped (*live 0) -- a member with no row has nothing to run, and one
 * whose row says otherwise (an edit by hand) is not waiting. */
static int take_member(Claim *c, long count, RedisModuleString *id, int *live) {
    *live = 0;
    if (taken(c, id)) {
        RedisModule_FreeString(NULL, id);
        return EMQ_OK;
    }
    Claimed *j = add_job(c, count, id);
    int err = emq_open_derived(c->ctx, c->user, &j->row, j->row_name, EMQ_DERIVED_READ_WRITE);
    if (!err && !emq_type_ok(&j->row, REDISMODULE_KEYTYPE_HASH)) err = EMQ_ERR_WRONGTYPE;
    if (err) return err;
    RedisModuleString *state = emq_hget(&j->row, emq_str.state);
    *live = emq_member_live(state != NULL, state && emq_str_equal(state, emq_str.pending));
    if (state) RedisModule_FreeString(NULL, state);
    if (*live) return count_claim(c, j);
    emq_key_close(&j->row);
    RedisModule_FreeString(c->ctx, j->row_name);
    RedisModule_FreeString(c->ctx, j->id);
    c->n--;
    return EMQ_OK;
}

/* An entry of <pending> (`id` is ours): taken when live (emq_entry_live),
 * else a tombstone (*live 0). */
static int take_if_live(Claim *c, long count, RedisModuleString *id, int *live) {
    *live = 0;
    if (taken(c, id)) {
        RedisModule_FreeString(NULL, id);
        return EMQ_OK;
    }
    Claimed *j = add_job(c, count, id);
    int err = emq_open_derived(c->ctx, c->user, &j->row, j->row_name, EMQ_DERIVED_READ_WRITE);
    if (!err && !emq_type_ok(&j->row, REDISMODULE_KEYTYPE_HASH)) err = EMQ_ERR_WRONGTYPE;
    if (err) return err;
    RedisModuleString *state = emq_hget(&j->row, emq_str.state);
    int pending = state && emq_str_equal(state, emq_str.pending);
    if (state) RedisModule_FreeString(NULL, state);
    *live = emq_entry_live(!emq_key_empty(&j->row), pending, emq_hexists(&j->row, emq_str.priority),
                           emq_lanes_is_delayed(&c->lanes, id), 0);
    if (*live) return count_claim(c, j);
    emq_key_close(&j->row);
    RedisModule_FreeString(c->ctx, j->row_name);
    RedisModule_FreeString(c->ctx, j->id);
    c->n--;
    return EMQ_OK;
}

/* <base>priority as it will be once the promotion is applied: its members
 * (read with the range iterator, which no write may meet: nothing is
 * written before apply) merged with the promoted ones, by score. */
typedef struct {
    EmqLanes *l;
    int iterating;
    RedisModuleString *head; /* the iterator's current member, or NULL */
    double head_score;
    long promoted; /* the next of l->promoted_priority */
} PriorityStream;

static void ps_advance(PriorityStream *ps) {
    ps->head = NULL;
    if (!ps->iterating) return;
    if (RedisModule_ZsetRangeEndReached(ps->l->priority.key)) return;
    ps->head = RedisModule_ZsetRangeCurrentElement(ps->l->priority.key, &ps->head_score);
    RedisModule_ZsetRangeNext(ps->l->priority.key);
}

static void ps_open(PriorityStream *ps, EmqLanes *l) {
    memset(ps, 0, sizeof *ps);
    ps->l = l;
    if (!emq_key_empty(&l->priority)) {
        ps->iterating = RedisModule_ZsetFirstInScoreRange(l->priority.key, -HUGE_VAL, HUGE_VAL, 0, 0) ==
                        REDISMODULE_OK;
        ps_advance(ps);
    }
}

static void ps_close(PriorityStream *ps) {
    if (ps->head) RedisModule_FreeString(NULL, ps->head);
    if (ps->iterating) RedisModule_ZsetRangeStop(ps->l->priority.key);
}

/* The level of the stream's next job, 0 when it has none (*more 0). */
static long long ps_level(PriorityStream *ps, int *more) {
    EmqIds *p = &ps->l->promoted_priority;
    int from_promoted = ps->promoted < p->n && (!ps->head || (double)p->scores[ps->promoted] < ps->head_score);
    *more = ps->head != NULL || ps->promoted < p->n;
    if (!*more) return 0;
    return emq_priority_level(from_promoted ? (double)p->scores[ps->promoted] : ps->head_score);
}

/* The stream's next job, which leaves <base>priority at apply (a new string). */
static RedisModuleString *ps_take(PriorityStream *ps) {
    EmqIds *p = &ps->l->promoted_priority;
    RedisModuleString *id;
    if (ps->promoted < p->n && (!ps->head || (double)p->scores[ps->promoted] < ps->head_score)) {
        id = p->ids[ps->promoted++];
        RedisModule_RetainString(NULL, id);
    } else {
        id = ps->head;
        ps_advance(ps);
    }
    emq_ids_add(&ps->l->leave_priority, id, 0);
    return id;
}

/* Where a claim is in the ungrouped lanes: <base>priority's stream, the
 * next entry of <pending>, the next promoted tail; the drops (every entry
 * and member dropped, the bound: EMQ_DROP_MAX a call) and the tombstones
 * among them (counted off `stale`). */
typedef struct {
    PriorityStream ps;
    long index, next_promoted, drops, tombstones;
    int empty; /* the ungrouped lanes have nothing more */
} Walk;

/* The next job of the ungrouped lanes, from the lane emq_priority_goes_first
 * and emq_entry_live say: *took 1 when one was taken. */
static int take_ungrouped(Claim *c, Walk *w, long count, int *took) {
    EmqLanes *l = &c->lanes;
    long before = c->n;
    int err = EMQ_OK;
    while (!err && c->n == before) {
        int more, live = 0;
        long long level = ps_level(&w->ps, &more);
        if (more && emq_priority_goes_first(level)) {
            if (w->drops >= EMQ_DROP_MAX) {
                c->bound_hit = 1;
                break;
            }
            err = take_member(c, count, ps_take(&w->ps), &live);
            if (!err && !live) w->drops++;
            continue;
        }
        while (!err && !live) {
            if (w->drops >= EMQ_DROP_MAX) {
                c->bound_hit = 1;
                break;
            }
            RedisModuleString *entry = emq_lanes_entry(l, w->index);
            if (entry == NULL) break;
            w->index++;
            err = take_if_live(c, count, entry, &live);
            if (!err && !live) w->drops++, w->tombstones++;
        }
        if (err || c->bound_hit) break;
        if (live) continue;
        if (w->next_promoted < l->promoted_tails.n) {
            RedisModuleString *id = l->promoted_tails.ids[w->next_promoted++];
            RedisModule_RetainString(NULL, id);
            err = take(c, count, id);
        } else if (more) {
            err = take_member(c, count, ps_take(&w->ps), &live);
            if (!err && !live) w->drops++;
        } else {
            w->empty = 1;
            break;
        }
    }
    *took = c->n > before;
    return err;
}

/* The next stored member of a group's lane after the ones this call read
 * (scores are unique in a lane: each a seq of its own), or NULL. */
static RedisModuleString *lane_next(EmqGroupLane *g, double *score) {
    if (emq_key_empty(&g->lane)) return NULL;
    RedisModuleString *id = NULL;
    if (RedisModule_ZsetFirstInScoreRange(g->lane.key, g->taken ? g->last_score : -HUGE_VAL, HUGE_VAL,
                                          g->taken ? 1 : 0, 0) == REDISMODULE_OK) {
        if (!RedisModule_ZsetRangeEndReached(g->lane.key)) id = RedisModule_ZsetRangeCurrentElement(g->lane.key, score);
        RedisModule_ZsetRangeStop(g->lane.key);
    }
    return id;
}

/* The next job of a group's lane (its stored members merged by score with
 * the ones this call promoted into it): *took 1 when one was taken. */
static int take_grouped(Claim *c, Walk *w, long at, long count, int *took) {
    long before = c->n;
    int err = EMQ_OK;
    while (!err && c->n == before) {
        if (w->drops >= EMQ_DROP_MAX) {
            c->bound_hit = 1;
            break;
        }
        EmqGroupLane *g = &c->lanes.gl[at];
        double score = 0;
        RedisModuleString *id = lane_next(g, &score);
        if (g->promoted.n > 0 && g->promoted_next < g->promoted.n &&
            (id == NULL || (double)g->promoted.scores[g->promoted_next] < score)) {
            if (id) RedisModule_FreeString(NULL, id);
            id = g->promoted.ids[g->promoted_next++];
            RedisModule_RetainString(NULL, id);
        } else if (id) {
            g->taken++;
            g->last_score = score;
        } else {
            break;
        }
        emq_ids_add(&g->leave, id, 0);
        int live;
        err = take_member(c, count, id, &live);
        if (!err && !live) w->drops++;
    }
    *took = c->n > before;
    return err;
}

/* 1 when a group's lane holds a job after the ones this call took. */
static int lane_has_more(EmqGroupLane *g) {
    if (g->promoted_next < g->promoted.n) return 1;
    double score;
    RedisModuleString *id = lane_next(g, &score);
    if (id) RedisModule_FreeString(NULL, id);
    return id != NULL;
}

/* A claim of a queue with groups (<base>groups, the ring, exists): each job
 * from the ring's head member, which moves to the tail -- the empty name
 * the ungrouped lanes, any other its group's lane; a group whose lane is
 * empty leaves the ring.  The ring is read as it stands from its head
 * (l->ring_pops), then what this call pushed (from l->ring_push_from). */
static int rotate(Claim *c, Walk *w, long count) {
    EmqLanes *l = &c->lanes;
    int err = EMQ_OK;
    long idle = 0;
    while (!err && c->n < count && !c->bound_hit) {
        long size = (l->ring_len - l->ring_pops) + (l->ring_push.n - l->ring_push_from);
        if (size == 0 || idle >= size) break;
        RedisModuleString *m;
        int stored = l->ring_pops < l->ring_len;
        if (stored) {
            m = emq_lanes_ring_at(l, l->ring_pops++);
            if (m == NULL) {
                idle++;
                continue;
            }
        } else {
            m = l->ring_push.ids[l->ring_push_from++];
            RedisModule_RetainString(NULL, m);
        }
        size_t len;
        RedisModule_StringPtrLen(m, &len);
        int took = 0;
        if (len == 0) {
            if (stored) l->ring_popped_empty = 1;
            if (!w->empty) err = take_ungrouped(c, w, count, &took);
            emq_ids_add(&l->ring_push, m, 0);
        } else {
            long at;
            err = emq_lanes_group(l, m, &at);
            if (!err) err = take_grouped(c, w, at, count, &took);
            /* A group leaves the ring with its lane's last job (or when its
             * lane is found empty); the bound leaves it for the next call. */
            if (!err && ((took && lane_has_more(&l->gl[at])) || (!took && c->bound_hit)))
                emq_ids_add(&l->ring_push, m, 0);
            else if (!err) l->gl[at].leaves = 1;
        }
        RedisModule_FreeString(NULL, m);
        idle = took ? 0 : idle + 1;
    }
    return err;
}

/* Decide the claim: promote what is due, then take up to `count` jobs --
 * from the ungrouped lanes, or round the ring when the queue has groups --
 * and check every row before anything is written: the claim takes all of
 * them or none.  Tombstones met on the way are dropped (at most
 * EMQ_DROP_MAX: c->bound_hit, and the rest waits for the next call). */
static int collect(Claim *c, long long now, long count) {
    EmqLanes *l = &c->lanes;
    l->user = c->user;
    int err = emq_lanes_open(l, EMQ_LANE_ALL);
    if (!err && l->meta_ring) err = emq_lanes_open_ring(l);
    if (!err) err = emq_lanes_promote(l, now);
    if (err) return err;
    /* The promoted jobs of a level follow its waiting ones (their seq is
     * newer); across levels they are merged by score. */
    emq_sort_scored(&l->promoted_priority);
    for (long i = 0; i < l->ngl; i++) emq_sort_scored(&l->gl[i].promoted);
    Walk w;
    memset(&w, 0, sizeof w);
    ps_open(&w.ps, l);
    if (l->ring_len > 0 || l->ring_push.n > 0) {
        err = rotate(c, &w, count);
    } else {
        int took = 1;
        while (!err && took && c->n < count) err = take_ungrouped(c, &w, count, &took);
    }
    ps_close(&w.ps);
    if (err) return err;
    /* <pending> loses what was read of it, the promoted entries taken included. */
    l->pops = w.index + w.next_promoted;
    /* Never below 0 (a hand-deleted row dropped more than `stale` counted),
     * and written only when it changes. */
    long long stale = l->stale > w.tombstones ? l->stale - w.tombstones : 0;
    if (stale != l->stale) {
        l->stale = stale;
        l->stale_changed = 1;
    }
    return EMQ_OK;
}

/* The lanes first (the promotion, the entries taken and dropped), then
 * each job as before: its row, its lease. */
static void apply(Claim *c, EmqFx *fx, long long now, long long deadline) {
    emq_lanes_apply(&c->lanes, fx);
    size_t reclen = 0;
    for (long i = 0; i < c->n; i++) {
        Claimed *j = &c->jobs[i];
        RedisModuleString *token = RedisModule_CreateString(c->ctx, j->token, (size_t)j->tokenlen);
        emq_fx_hset(fx, &j->row, "hincrby", 1, emq_str.attempts, emq_fx_number(fx, j->attempts));
        emq_fx_hset(fx, &j->row, "hset", 4, emq_str.tries, emq_fx_number(fx, j->tries), emq_str.token, token,
                    emq_str.state, emq_str.active, emq_str.claimed_at, emq_fx_number(fx, now));
        emq_fx_hdel(fx, &j->row, emq_str.closed_by);
        emq_fx_zadd(fx, c->active, deadline, j->id, 0);
        RedisModule_FreeString(c->ctx, token);
        size_t idlen;
        RedisModule_StringPtrLen(j->id, &idlen);
        reclen += emq_record_item_size(idlen) + emq_record_item_size((size_t)j->tokenlen);
    }
    emq_flow_claim_apply(&c->flow, fx, c->n);
    emq_groups_claimed_apply(&c->groups, fx);
    if (c->record_name == NULL || c->n == 0) return;
    /* Remembered as long as the lease: a retry after that finds the jobs
     * lapsed anyway. */
    char *rec = RedisModule_Alloc(reclen), *p = rec;
    for (long i = 0; i < c->n; i++) {
        size_t idlen;
        const char *id = RedisModule_StringPtrLen(c->jobs[i].id, &idlen);
        p += emq_record_put(p, id, idlen);
        p += emq_record_put(p, c->jobs[i].token, (size_t)c->jobs[i].tokenlen);
    }
    RedisModuleString *value = RedisModule_CreateString(c->ctx, rec, reclen);
    emq_fx_set(fx, &c->record, value);
    emq_fx_pexpireat(fx, &c->record, deadline);
    RedisModule_FreeString(c->ctx, value);
    RedisModule_Free(rec);
}

/* ------------------------------------------------------------------------
 * EMQ.CLAIM <pending> <active> <base> <lease-ms> [COUNT <n>] [REQ <request-id>]
 *           [BLOCK <ms>]
 *
 * Reply: an array of up to <n> (default 1) jobs, each [id, token, payload,
 * attempt, state], oldest first (recovered jobs sit at score 0, ahead of
 * the enqueue-time scores); null when nothing is claimable (the queue is
 * empty, every waiting job is delayed, or the queue is paused): nothing
 * was written then.  With REQ, a retry of the same request answers the
 * jobs that request claimed and still holds.
 *
 * With BLOCK, a claim that finds nothing claimable waits up to <ms> (0: no
 * limit) for a job to become claimable and is then answered as a claim made
 * at that moment (its lease starts then; its REQ record is written then);
 * null when the time runs out.  Waiting claims are served first come, first
 * served.  Inside MULTI, a script, or wherever the server denies blocking,
 * it answers at once, as without BLOCK.  While it waits, a <pending> that is
 * deleted or replaced by another type keeps it waiting (as BZPOPMIN), until
 * <pending> has a claimable job again or the time runs out.
 * ------------------------------------------------------------------------ */

typedef struct {
    long long count;
    RedisModuleString *req;
    long long block; /* -1: no BLOCK */
    long long deadline;
    RedisModuleString *result; /* COMPLETECLAIM's RESULT, or NULL */
} ClaimArgs;

/* The options from argv[first] on (BLOCK only where `block`, RESULT only
 * where `result`), in the order the errors are answered. */
static int parse_options(RedisModuleString **argv, int argc, int first, int block, int result, long long now,
                         ClaimArgs *a) {
    a->count = 1;
    a->req = NULL;
    a->block = -1;
    a->result = NULL;
    int seen_count = 0;
    for (int i = first; i < argc; i += 2) {
        size_t len;
        const char *opt = RedisModule_StringPtrLen(argv[i], &len);
        if (i + 1 >= argc) return EMQ_ERR_SYNTAX;
        size_t vlen;
        const char *val = RedisModule_StringPtrLen(argv[i + 1], &vlen);
        if (emq_option_is(opt, len, "COUNT") && !seen_count) {
            seen_count = 1;
            int err = emq_parse_count(EMQ_COUNT_CLAIM, val, vlen, &a->count);
            if (err) return err;
        } else if (emq_option_is(opt, len, "REQ") && !a->req) {
            if (vlen == 0) return EMQ_ERR_REQ_EMPTY;
            a->req = argv[i + 1];
        } else if (block && emq_option_is(opt, len, "BLOCK") && a->block < 0) {
            int err = emq_parse_block(now, val, vlen, &a->block);
            if (err) return err;
        } else if (result && emq_option_is(opt, len, "RESULT") && !a->result) {
            a->result = argv[i + 1];
            int err = emq_check_result(a->result);
            if (err) return err;
        } else {
            return EMQ_ERR_SYNTAX;
        }
    }
    return EMQ_OK;
}

/* COUNT above the ceiling claims this many: EMQ_MAX_CLAIM_COUNT, or the
 * server's emq.max-limit when that is lower. */
static long long claim_ceiling(long long count) {
    long long max = emq_config_max_limit() < EMQ_MAX_CLAIM_COUNT ? emq_config_max_limit() : EMQ_MAX_CLAIM_COUNT;
    return count > max ? max : count;
}

/* Everything but the arity, in the order the errors are answered. */
static int parse_args(RedisModuleCtx *ctx, RedisModuleString **argv, int argc, long long now, ClaimArgs *a) {
    int err = parse_options(argv, argc, 5, 1, 0, now, a);
    if (err) return err;
    err = emq_check_queue(ctx, &argv[1], PENDING_ACTIVE, 2, argv[3], EMQ_ERR_PENDING_ACTIVE_KEYS);
    if (err) return err;
    a->count = claim_ceiling(a->count);
    size_t lease_len;
    const char *lease = RedisModule_StringPtrLen(argv[4], &lease_len);
    return emq_lease_deadline(now, lease, lease_len, &a->deadline);
}

enum { CLAIM_ANSWERED, CLAIM_NOTHING };

/* Open, type-check, read and decide, writing nothing: EMQ_OK and *outcome
 * CLAIM_ANSWERED (c->n jobs to apply, or a retry's to answer as they are)
 * or CLAIM_NOTHING (then *due is when to look again: the earliest future
 * due time in <base>delayed, the next millisecond when a bound left work
 * for the next call, or -1).  Nothing claimable may still leave lane work
 * to apply: due members promoted, tombstones dropped.  c->active is open
 * already.  `waiting`: the call of a blocked claim, which keeps waiting (is
 * not answered WRONGTYPE) when a lane holds another type.  `done`: the job
 * COMPLETECLAIM completes in the same call (NULL for CLAIM). */
static int claim_prepare(Claim *c, RedisModuleString *pending, const ClaimArgs *a, long long now, int waiting,
                         RedisModuleString *done, int *outcome, long long *due) {
    const int rw = REDISMODULE_READ | REDISMODULE_WRITE;
    *outcome = CLAIM_ANSWERED;
    *due = -1;
    emq_key_open(c->ctx, &c->pending, pending, rw);
    emq_lanes_init(&c->lanes, c->ctx, NULL, c->base, &c->pending);
    c->done = done;
    if (!emq_type_ok(&c->pending, REDISMODULE_KEYTYPE_LIST)) {
        if (!waiting) return EMQ_ERR_WRONGTYPE;
        *outcome = CLAIM_NOTHING;
        return EMQ_OK;
    }
    if (!emq_type_ok(c->active, REDISMODULE_KEYTYPE_ZSET)) return EMQ_ERR_WRONGTYPE;
    if (!emq_acl_user(c->ctx, &c->user)) return EMQ_ERR_NOPERM_DERIVED;
    int err = EMQ_OK;
    if (a->req) {
        c->record_name = emq_derived_key(c->ctx, c->base, "req:", a->req);
        err = emq_open_derived(c->ctx, c->user, &c->record, c->record_name, EMQ_DERIVED_RECORD);
        if (!err && !emq_type_ok(&c->record, REDISMODULE_KEYTYPE_STRING)) err = EMQ_ERR_WRONGTYPE;
        if (err) return err;
    }
    if (a->req && !emq_key_empty(&c->record)) { /* a retry: answered from the record, never waits */
        /* Read in place: a forged record of any size is never copied. */
        size_t reclen;
        const char *rec = RedisModule_StringDMA(c->record.key, &reclen, REDISMODULE_READ);
        c->reanswered = 1;
        return reanswer(c, rec, reclen, done);
    }
    EmqMeta meta;
    err = emq_read_meta(c->ctx, c->user, c->base, &meta);
    if (!err && meta.paused) {
        *outcome = CLAIM_NOTHING; /* RESUME wakes the waiting claims */
        return EMQ_OK;
    }
    /* The rate limit and back-off (emq_flow.h): refused, a claim writes
     * nothing and looks again when the window opens or the back-off ends. */
    long long allowance = -1, reopen = -1, count = a->count;
    if (!err) err = emq_flow_claim_prepare(&c->flow, c->ctx, c->user, c->base, now, &allowance, &reopen);
    if (!err && allowance == 0) {
        *outcome = CLAIM_NOTHING;
        *due = reopen;
        return EMQ_OK;
    }
    if (allowance > 0 && allowance < count) count = allowance;
    if (!err) err = collect(c, now, (long)count);
    /* Each job taken counts in its group (checked now, written at apply). */
    if (!err) emq_groups_init(&c->groups, c->ctx, c->base, c->user);
    for (long i = 0; !err && i < c->n; i++) err = emq_groups_claimed(&c->groups, &c->jobs[i].row);
    if (err == EMQ_ERR_WRONGTYPE && waiting && !(emq_type_ok(&c->lanes.priority, REDISMODULE_KEYTYPE_ZSET) &&
                                                 emq_type_ok(&c->lanes.delayed, REDISMODULE_KEYTYPE_ZSET))) {
        *outcome = CLAIM_NOTHING; /* as BZPOPMIN keeps waiting on a key of another type */
        return EMQ_OK;
    }
    if (!err && c->n == 0) {
        long long next;
        *outcome = CLAIM_NOTHING;
        *due = c->bound_hit || emq_lanes_due_left(&c->lanes, now, &next) ? now + 1 : next;
    }
    return err;
}

/* Open, read, decide, apply and answer -- unless nothing is claimable:
 * then CLAIM_NOTHING, nothing answered (only the lanes' promotion and
 * dropped tombstones written), and *due when to look again (or -1). */
static int claim_run(RedisModuleCtx *ctx, RedisModuleString **argv, const ClaimArgs *a, long long now,
                     int waiting, long long *due) {
    Claim c = {.ctx = ctx, .base = argv[3]};
    c.active = &c.own_active;
    emq_key_open(ctx, &c.own_active, argv[2], REDISMODULE_READ | REDISMODULE_WRITE);
    EmqFx fx;
    emq_fx_begin(&fx, ctx);
    int outcome;
    int err = claim_prepare(&c, argv[1], a, now, waiting, NULL, &outcome, due);
    if (!err && !c.reanswered) apply(&c, &fx, now, a->deadline);
    if (err) emq_reply_error(ctx, err);
    else if (outcome == CLAIM_ANSWERED) reply_jobs(&c);
    emq_fx_commit(&fx);
    claim_release(&c);
    return err ? CLAIM_ANSWERED : outcome;
}

/* The server calls this for a waiting claim when <pending> is signalled:
 * REDISMODULE_OK when it answered, REDISMODULE_ERR to keep waiting. */
static int claim_when_ready(RedisModuleCtx *ctx, RedisModuleString **argv, int argc) {
    long long now = RedisModule_Milliseconds(), due;
    ClaimArgs a;
    int err = parse_args(ctx, argv, argc, now, &a);
    if (err) { /* the arguments passed when it blocked; only the lease can be too large now */
        emq_reply_error(ctx, err);
        return REDISMODULE_OK;
    }
    if (claim_run(ctx, argv, &a, now, 1, &due) == CLAIM_ANSWERED) return REDISMODULE_OK;
    emq_wait_again(ctx, due, now);
    return REDISMODULE_ERR;
}

/* The time ran out (or CLIENT UNBLOCK): null, as a claim that found nothing. */
static int claim_timed_out(RedisModuleCtx *ctx, RedisModuleString **argv, int argc) {
    (void)argv;
    (void)argc;
    return RedisModule_ReplyWithNull(ctx);
}

int EmqClaim_RedisCommand(RedisModuleCtx *ctx, RedisModuleString **argv, int argc) {
    /* parse */
    if (argc < 5) return RedisModule_WrongArity(ctx);
    long long now = RedisModule_Milliseconds(), due;
    ClaimArgs a;
    int err = parse_args(ctx, argv, argc, now, &a);
    if (err) return emq_reply_error(ctx, err);

    /* open, read, decide, apply, reply */
    if (claim_run(ctx, argv, &a, now, 0, &due) == CLAIM_ANSWERED) return REDISMODULE_OK;

    /* nothing claimable: answer null, or wait */
    if (a.block < 0 || !emq_may_block(ctx)) return RedisModule_ReplyWithNull(ctx);
    emq_wait(ctx, argv[1], a.block, due, now, claim_when_ready, claim_timed_out);
    return REDISMODULE_OK;
}

/* ------------------------------------------------------------------------
 * EMQ.COMPLETECLAIM <active> <job> <pending> <id> <token> <lease-ms>
 *                   [COUNT <n>] [REQ <request-id>] [RESULT <bytes>]
 *
 * EMQ.COMPLETE <active> <job> <id> <token> [RESULT <bytes>], then EMQ.CLAIM <pending>
 * <active> <base> <lease-ms> [COUNT <n>] [REQ <request-id>] (<base> from
 * <active>), in one call: a worker finishes a job and takes the next in
 * one round trip.  Everything both check comes first: an error answers
 * as its verb would, and then nothing was written, neither the complete
 * nor the claim.  Reply: [COMPLETE's reply (:1 or :-1), CLAIM's reply (an
 * array of jobs, or null)].  No BLOCK: a worker that got null claims with
 * BLOCK next.  Retry-safe as its two halves: a repeat answers :1
 * (closed_by) and, with REQ, the jobs the first call took.
 * ------------------------------------------------------------------------ */
int EmqCompleteClaim_RedisCommand(RedisModuleCtx *ctx, RedisModuleString **argv, int argc) {
    /* parse */
    if (argc < 7) return RedisModule_WrongArity(ctx);
    RedisModuleString *id = argv[4], *token = argv[5];
    int err = emq_complete_check(argv[1], argv[2], id);
    if (err) return emq_reply_error(ctx, err);
    long long now = RedisModule_Milliseconds();
    ClaimArgs a;
    err = parse_options(argv, argc, 7, 0, 1, now, &a);
    RedisModuleString *base = err ? NULL : emq_base_of(ctx, argv[1], "active");
    if (!err) {
        RedisModuleString *keys[2] = {argv[3], argv[1]};
        err = emq_check_queue(ctx, keys, PENDING_ACTIVE, 2, base, EMQ_ERR_PENDING_ACTIVE_KEYS);
    }
    if (!err) {
        a.count = claim_ceiling(a.count);
        size_t lease_len;
        const char *lease = RedisModule_StringPtrLen(argv[6], &lease_len);
        err = emq_lease_deadline(now, lease, lease_len, &a.deadline);
    }
    if (err) {
        if (base) RedisModule_FreeString(ctx, base);
        return emq_reply_error(ctx, err);
    }

    /* open, read, decide: the complete's, then the claim's */
    EmqCompleting done;
    EmqFx fx;
    emq_fx_begin(&fx, ctx);
    Claim c = {.ctx = ctx, .base = base, .active = &done.active};
    int outcome = CLAIM_NOTHING;
    long long due;
    err = emq_complete_prepare(ctx, &done, argv[1], argv[2], id, token, a.result);
    if (!err) err = claim_prepare(&c, argv[3], &a, now, 0, done.write ? id : NULL, &outcome, &due);

    /* apply, reply */
    if (!err) {
        emq_complete_apply(&fx, &done, id, now);
        if (!c.reanswered) apply(&c, &fx, now, a.deadline);
        RedisModule_ReplyWithArray(ctx, 2);
        RedisModule_ReplyWithLongLong(ctx, done.reply);
        if (outcome == CLAIM_ANSWERED) reply_jobs(&c);
        else RedisModule_ReplyWithNull(ctx);
    } else {
        emq_reply_error(ctx, err);
    }
    emq_fx_commit(&fx);
    claim_release(&c);
    emq_complete_close(&done);
    RedisModule_FreeString(ctx, base);
    return REDISMODULE_OK;
}
