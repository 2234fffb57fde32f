/* emq_claim_walk.c -- which jobs a claim takes (EMQ.CLAIM, COMPLETECLAIM's
 * claim, a woken blocked claim): per job the head of <base>priority when
 * its level is below 0, else the next live entry of <pending> (dropping
 * tombstones), else the head of <base>priority; in a queue with groups,
 * round the ring <base>groups instead (see emq_claim.c's header).  Every
 * row is checked and counted here, before the claim writes anything, and
 * each job taken gets its fresh token. */
#include <math.h>
#include <string.h>

#include "emq_claim.h"

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
    return count_claim(c, emq_claim_add_job(c, count, id));
}

/* Where a job a claim looks at stands, which decides the rule of "live". */
enum {
    /* A member of <base>priority or a group's lane, which leaves it either
     * way: taken when its row exists and says pending (emq_member_live),
     * else dropped -- a member with no row has nothing to run, and one
     * whose row says otherwise (an edit by hand) is not waiting. */
    TAKE_MEMBER,
    /* An entry of <pending>: taken when live (emq_entry_live), else a
     * tombstone. */
    TAKE_ENTRY,
};

/* Take `id` (ours) if it is live by the rule of `where` (*live 1), else
 * undo its slot (*live 0). */
static int take_job(Claim *c, long count, RedisModuleString *id, int where, int *live) {
    *live = 0;
    if (taken(c, id)) {
        RedisModule_FreeString(NULL, id);
        return EMQ_OK;
    }
    Claimed *j = emq_claim_add_job(c, count, id);
    int err = emq_open_derived(c->ctx, c->user, &j->row, j->row_name, EMQ_DERIVED_READ_WRITE);
    if (!err && !emq_type_ok(&j->row, REDISMODULE_KEYTYPE_HASH)) err = EMQ_ERR_WRONGTYPE;
    if (err) return err;
    RedisModuleString *state = emq_hget(&j->row, emq_str.state);
    int has_state = state != NULL, pending = state && emq_str_equal(state, emq_str.pending);
    if (state) RedisModule_FreeString(NULL, state);
    if (where == TAKE_MEMBER)
        *live = emq_member_live(has_state, pending);
    else
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
            err = take_job(c, count, ps_take(&w->ps), TAKE_MEMBER, &live);
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
            err = take_job(c, count, entry, TAKE_ENTRY, &live);
            if (!err && !live) w->drops++, w->tombstones++;
        }
        if (err || c->bound_hit) break;
        if (live) continue;
        if (w->next_promoted < l->promoted_tails.n) {
            RedisModuleString *id = l->promoted_tails.ids[w->next_promoted++];
            RedisModule_RetainString(NULL, id);
            err = take(c, count, id);
        } else if (more) {
            err = take_job(c, count, ps_take(&w->ps), TAKE_MEMBER, &live);
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
        err = take_job(c, count, id, TAKE_MEMBER, &live);
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
            EmqGroupLane *g = err ? NULL : &l->gl[at];
            /* A group paused or at its cap takes nothing and leaves (one a
             * cap lowered below its active count, or one pushed by this
             * call's promotion); one that reaches its cap here leaves with
             * the job that took its last slot. */
            int open = g && emq_group_claimable(1, g->paused, g->active + g->took, g->cap);
            if (open) err = take_grouped(c, w, at, count, &took);
            if (took) g->took++;
            open = open && emq_group_claimable(1, g->paused, g->active + g->took, g->cap);
            /* A group leaves the ring with its lane's last job (or when its
             * lane is found empty); the bound leaves it for the next call. */
            if (!err && open && ((took && lane_has_more(g)) || (!took && c->bound_hit)))
                emq_ids_add(&l->ring_push, m, 0);
            else if (!err) g->leaves = 1;
        }
        RedisModule_FreeString(NULL, m);
        idle = took ? 0 : idle + 1;
    }
    return err;
}

/* COMPLETECLAIM: the job its complete ends frees a slot of its group for
 * this claim (the group enters the ring if that slot was its cap's last). */
static int free_done_slot(Claim *c) {
    RedisModuleString *name = emq_derived_key(c->ctx, c->base, "job:", c->done);
    EmqKey row;
    emq_key_open(c->ctx, &row, name, REDISMODULE_READ);
    RedisModuleString *group = emq_row_group(&row);
    emq_key_close(&row);
    RedisModule_FreeString(c->ctx, name);
    if (group == NULL) return EMQ_OK;
    long at;
    int err = emq_lanes_group(&c->lanes, group, &at);
    RedisModule_FreeString(NULL, group);
    if (err) return err;
    EmqGroupLane *g = &c->lanes.gl[at];
    if (g->active > 0) g->active--;
    if (!g->in_ring && g->card > 0) emq_lanes_ring_enter(&c->lanes, g);
    return EMQ_OK;
}

/* Decide the claim: promote what is due, then take up to `count` jobs --
 * from the ungrouped lanes, or round the ring when the queue has groups --
 * and check every row before anything is written: the claim takes all of
 * them or none.  Tombstones met on the way are dropped (at most
 * EMQ_DROP_MAX: c->bound_hit, and the rest waits for the next call). */
int emq_claim_collect(Claim *c, long long now, long count) {
    EmqLanes *l = &c->lanes;
    l->user = c->user;
    int err = emq_lanes_open(l, EMQ_LANE_ALL);
    if (!err && l->meta_ring) err = emq_lanes_open_ring(l);
    if (!err && c->done) err = free_done_slot(c);
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
