/* emq_lanes.c -- see emq_lanes.h. */
#include "emq_lanes.h"

#include <limits.h>
#include <stdint.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "emq.h"

void emq_ids_add(EmqIds *a, RedisModuleString *id, long long score) {
    if (a->n == a->cap) {
        a->cap = a->cap ? a->cap * 2 : 8;
        a->ids = RedisModule_Realloc(a->ids, (size_t)a->cap * sizeof *a->ids);
        a->scores = RedisModule_Realloc(a->scores, (size_t)a->cap * sizeof *a->scores);
    }
    RedisModule_RetainString(NULL, id);
    a->ids[a->n] = id;
    a->scores[a->n++] = score;
}

void emq_ids_free(EmqIds *a) {
    for (long i = 0; i < a->n; i++) RedisModule_FreeString(NULL, a->ids[i]);
    RedisModule_Free(a->ids);
    RedisModule_Free(a->scores);
    memset(a, 0, sizeof *a);
}

/* By score; the scores of a promotion are all different (each its own seq). */
static int by_score(const void *a, const void *b) {
    long long x = ((const long long *)a)[0], y = ((const long long *)b)[0];
    return (x > y) - (x < y);
}

void emq_sort_scored(EmqIds *a) {
    if (a->n < 2) return;
    long long *pairs = RedisModule_Alloc((size_t)a->n * 2 * sizeof *pairs);
    for (long i = 0; i < a->n; i++) pairs[2 * i] = a->scores[i], pairs[2 * i + 1] = i;
    qsort(pairs, (size_t)a->n, 2 * sizeof *pairs, by_score);
    RedisModuleString **ids = RedisModule_Alloc((size_t)a->n * sizeof *ids);
    for (long i = 0; i < a->n; i++) {
        ids[i] = a->ids[pairs[2 * i + 1]];
        a->scores[i] = pairs[2 * i];
    }
    memcpy(a->ids, ids, (size_t)a->n * sizeof *ids);
    RedisModule_Free(ids);
    RedisModule_Free(pairs);
}

void emq_lanes_init(EmqLanes *l, RedisModuleCtx *ctx, RedisModuleUser *user, RedisModuleString *base,
                    EmqKey *pending) {
    memset(l, 0, sizeof *l);
    l->ctx = ctx;
    l->user = user;
    l->base = base;
    l->pending = pending;
}

static void drop_window(EmqLanes *l) {
    for (long i = 0; i < l->window_n; i++) RedisModule_FreeString(NULL, l->window[i]);
    RedisModule_Free(l->window);
    l->window = NULL;
    l->window_n = 0;
}

void emq_lanes_close(EmqLanes *l) {
    drop_window(l);
    EmqIds *all[] = {&l->leave_delayed, &l->tails,          &l->heads,           &l->priority_add,
                     &l->delayed_add,   &l->leave_priority, &l->promoted_tails, &l->promoted_priority,
                     &l->priority_heads};
    for (size_t i = 0; i < sizeof all / sizeof *all; i++) emq_ids_free(all[i]);
    for (long i = 0; i < l->ngl; i++) {
        EmqGroupLane *g = &l->gl[i];
        emq_key_close(&g->lane);
        emq_ids_free(&g->add);
        emq_ids_free(&g->leave);
        emq_ids_free(&g->heads);
        emq_ids_free(&g->promoted);
        RedisModule_FreeString(NULL, g->group);
        RedisModule_FreeString(l->ctx, g->lane_name);
        RedisModule_FreeString(l->ctx, g->hash_name);
    }
    RedisModule_Free(l->gl);
    l->gl = NULL;
    l->ngl = 0;
    if (l->gl_index) RedisModule_FreeDict(NULL, l->gl_index);
    l->gl_index = NULL;
    emq_ids_free(&l->ring_push);
    if (l->ring_opened) emq_key_close(&l->ring);
    if (l->ring_name) RedisModule_FreeString(l->ctx, l->ring_name);
    l->ring_opened = 0;
    if (l->opened & EMQ_LANE_META) emq_key_close(&l->meta);
    if (l->opened & EMQ_LANE_DELAYED) emq_key_close(&l->delayed);
    if (l->opened & EMQ_LANE_PRIORITY) emq_key_close(&l->priority);
    if (l->meta_name) RedisModule_FreeString(l->ctx, l->meta_name);
    if (l->delayed_name) RedisModule_FreeString(l->ctx, l->delayed_name);
    if (l->priority_name) RedisModule_FreeString(l->ctx, l->priority_name);
    l->opened = 0;
}

static int read_counter(EmqKey *meta, RedisModuleString *field, long long *out) {
    RedisModuleString *v = emq_hget(meta, field);
    size_t len = 0;
    const char *p = v ? RedisModule_StringPtrLen(v, &len) : NULL;
    int err = emq_parse_meta_counter(p, len, v != NULL, out);
    if (v) RedisModule_FreeString(NULL, v);
    return err;
}

static int open_set(EmqLanes *l, EmqKey *k, RedisModuleString **name, const char *suffix, int bit) {
    *name = emq_derived_key(l->ctx, l->base, suffix, NULL);
    l->opened |= bit;
    int err = emq_open_derived(l->ctx, l->user, k, *name, EMQ_DERIVED_LANE);
    if (!err && !emq_type_ok(k, REDISMODULE_KEYTYPE_ZSET)) err = EMQ_ERR_WRONGTYPE;
    return err;
}

int emq_lanes_open(EmqLanes *l, int which) {
    int err = EMQ_OK;
    if (!err && (which & EMQ_LANE_PRIORITY) && !(l->opened & EMQ_LANE_PRIORITY)) {
        err = open_set(l, &l->priority, &l->priority_name, "priority", EMQ_LANE_PRIORITY);
        if (!err && !emq_key_empty(&l->priority)) l->priority_card = (long)RedisModule_ValueLength(l->priority.key);
    }
    if (!err && (which & EMQ_LANE_DELAYED) && !(l->opened & EMQ_LANE_DELAYED))
        err = open_set(l, &l->delayed, &l->delayed_name, "delayed", EMQ_LANE_DELAYED);
    if (!err && (which & EMQ_LANE_META) && !(l->opened & EMQ_LANE_META)) {
        l->meta_name = emq_derived_key(l->ctx, l->base, "meta", NULL);
        l->opened |= EMQ_LANE_META;
        err = emq_open_derived(l->ctx, l->user, &l->meta, l->meta_name, EMQ_DERIVED_READ_WRITE);
        if (!err && !emq_type_ok(&l->meta, REDISMODULE_KEYTYPE_HASH)) err = EMQ_ERR_WRONGTYPE;
        if (!err) err = read_counter(&l->meta, emq_str.stale, &l->stale);
        if (!err) err = read_counter(&l->meta, emq_str.seq, &l->seq);
        if (!err) l->meta_ring = emq_hexists(&l->meta, emq_str.ring);
    }
    return err;
}

int emq_lanes_place(EmqLanes *l, RedisModuleString *id, long long level, int end) {
    if (level == 0) {
        emq_ids_add(end == EMQ_AT_HEAD ? &l->heads : &l->tails, id, 0);
        return EMQ_OK;
    }
    int err = emq_lanes_open(l, end == EMQ_AT_HEAD ? EMQ_LANE_PRIORITY : EMQ_LANE_PRIORITY | EMQ_LANE_META);
    if (err) return err;
    if (end == EMQ_AT_HEAD) {
        emq_ids_add(&l->priority_heads, id, level); /* its seq needs the call's other heads: settle_heads */
        return EMQ_OK;
    }
    /* The counter restarts where no job waits in the lane to be overtaken. */
    l->seq = emq_next_seq(l->seq, l->priority_card == 0 && l->priority_add.n == 0 && l->priority_heads.n == 0);
    l->seq_changed = 1;
    emq_ids_add(&l->priority_add, id, emq_priority_score(level, l->seq));
    return EMQ_OK;
}

RedisModuleString *emq_row_group(EmqKey *row) {
    return emq_type_ok(row, REDISMODULE_KEYTYPE_HASH) ? emq_hget(row, emq_str.group) : NULL;
}

int emq_lanes_open_ring(EmqLanes *l) {
    if (l->ring_opened) return EMQ_OK;
    l->ring_opened = 1;
    l->ring_name = emq_derived_key(l->ctx, l->base, "groups", NULL);
    int err = emq_open_derived(l->ctx, l->user, &l->ring, l->ring_name, EMQ_DERIVED_READ_WRITE);
    if (!err && !emq_type_ok(&l->ring, REDISMODULE_KEYTYPE_LIST)) err = EMQ_ERR_WRONGTYPE;
    if (!err && !emq_key_empty(&l->ring)) l->ring_len = (long)RedisModule_ValueLength(l->ring.key);
    return err;
}

RedisModuleString *emq_lanes_ring_at(EmqLanes *l, long index) {
    if (!l->ring_opened || index >= l->ring_len) return NULL;
    RedisModuleCallReply *r = RedisModule_Call(l->ctx, "LINDEX", "sl", l->ring_name, (long long)index);
    RedisModuleString *s = NULL;
    if (r && RedisModule_CallReplyType(r) == REDISMODULE_REPLY_STRING) s = RedisModule_CreateStringFromCallReply(r);
    if (r) RedisModule_FreeCallReply(r);
    return s;
}

int emq_lanes_group(EmqLanes *l, RedisModuleString *group, long *at) {
    size_t len;
    const char *p = RedisModule_StringPtrLen(group, &len);
    if (l->gl_index == NULL) l->gl_index = RedisModule_CreateDict(NULL);
    int missing = 0;
    uintptr_t found = (uintptr_t)RedisModule_DictGetC(l->gl_index, (void *)p, len, &missing);
    if (!missing && found > 0) {
        *at = (long)found - 1;
        return EMQ_OK;
    }
    int err = emq_lanes_open_ring(l);
    if (err) return err;
    if (l->ngl == l->capgl) {
        l->capgl = l->capgl ? 2 * l->capgl : 4;
        l->gl = RedisModule_Realloc(l->gl, (size_t)l->capgl * sizeof *l->gl);
    }
    EmqGroupLane *g = &l->gl[l->ngl];
    memset(g, 0, sizeof *g);
    RedisModule_RetainString(NULL, group);
    g->group = group;
    g->lane_name = emq_derived_key(l->ctx, l->base, "g:", group);
    g->hash_name = emq_derived_key(l->ctx, l->base, "group:", group);
    *at = l->ngl++;
    RedisModule_DictSetC(l->gl_index, (void *)p, len, (void *)(uintptr_t)l->ngl);
    err = emq_open_derived(l->ctx, l->user, &g->lane, g->lane_name, EMQ_DERIVED_LANE);
    if (!err && !emq_type_ok(&g->lane, REDISMODULE_KEYTYPE_ZSET)) err = EMQ_ERR_WRONGTYPE;
    if (!err && !emq_key_empty(&g->lane)) g->card = (long)RedisModule_ValueLength(g->lane.key);
    EmqKey h = {0};
    if (!err) err = emq_open_derived(l->ctx, l->user, &h, g->hash_name, EMQ_DERIVED_READ_WRITE);
    if (!err && !emq_type_ok(&h, REDISMODULE_KEYTYPE_HASH)) err = EMQ_ERR_WRONGTYPE;
    if (!err) {
        g->in_ring = emq_hexists(&h, emq_str.ring);
        g->paused = emq_hexists(&h, emq_str.paused);
        err = emq_group_caps_read(l->ctx, l->base, &h, &g->active, &g->cap);
    }
    emq_key_close(&h);
    if (!err) err = emq_group_index_check(l->ctx, l->user, l->base);
    return err;
}

/* The group enters the ring's tail (the ring made with the empty name, the
 * ungrouped lanes, first). */
void emq_lanes_ring_enter(EmqLanes *l, EmqGroupLane *g) {
    if (g->in_ring || g->enters) return;
    if (!emq_group_claimable(1, g->paused, g->active, g->cap)) {
        g->held = 1;
        return;
    }
    g->enters = 1;
    if (l->ring_len == 0 && l->ring_push.n == 0) emq_ids_add(&l->ring_push, emq_str.empty, 0);
    emq_ids_add(&l->ring_push, g->group, 0);
}

/* The seq of the level's first (last: `last`) member of `set` as it stands
 * (*has 0: none).  O(log n). */
static long long edge_seq(EmqKey *set, long long level, int last, int *has) {
    *has = 0;
    if (emq_key_empty(set)) return 0;
    double from = (double)emq_priority_score(level, 0), to = (double)emq_priority_score(level + 1, 0);
    long long seq = 0;
    int ok = last ? RedisModule_ZsetLastInScoreRange(set->key, from, to, 0, 1)
                  : RedisModule_ZsetFirstInScoreRange(set->key, from, to, 0, 1);
    if (ok == REDISMODULE_OK) {
        if (!RedisModule_ZsetRangeEndReached(set->key)) {
            double score;
            RedisModuleString *id = RedisModule_ZsetRangeCurrentElement(set->key, &score);
            RedisModule_FreeString(NULL, id);
            *has = 1;
            seq = (long long)score - emq_priority_score(level, 0);
        }
        RedisModule_ZsetRangeStop(set->key);
    }
    return seq;
}

int emq_lanes_place_in(EmqLanes *l, RedisModuleString *id, RedisModuleString *group, long long level, int end) {
    if (group == NULL) return emq_lanes_place(l, id, level, end);
    long at;
    int err = emq_lanes_group(l, group, &at);
    if (!err) err = emq_lanes_open(l, EMQ_LANE_META);
    if (err) return err;
    EmqGroupLane *g = &l->gl[at];
    if (end == EMQ_AT_HEAD) {
        emq_ids_add(&g->heads, id, level);
    } else {
        /* <base>meta's seq, but above the lane's own last seq at the level:
         * the counter restarts when <base>priority is empty, a group's lane
         * may not be. */
        int has;
        long long last = edge_seq(&g->lane, level, 1, &has);
        long long seq = emq_next_seq(l->seq, 0);
        if (has && seq <= last) seq = last + 1;
        l->seq = seq;
        l->seq_changed = 1;
        emq_ids_add(&g->add, id, emq_priority_score(level, seq));
    }
    if (!g->in_ring) emq_lanes_ring_enter(l, g);
    return EMQ_OK;
}

int emq_lanes_enter_in(EmqLanes *l, RedisModuleString *id, RedisModuleString *group, long long level, long long due,
                       long long now) {
    return due != now ? emq_lanes_delay(l, id, due) : emq_lanes_place_in(l, id, group, level, EMQ_AT_TAIL);
}

int emq_lanes_remove_in(EmqLanes *l, RedisModuleString *id, RedisModuleString *group, long long level) {
    if (group == NULL) return emq_lanes_remove(l, id, level);
    int err = emq_lanes_open(l, EMQ_LANE_DELAYED);
    if (err) return err;
    if (emq_lanes_is_delayed(l, id)) {
        emq_ids_add(&l->leave_delayed, id, 0);
        return EMQ_OK;
    }
    long at;
    err = emq_lanes_group(l, group, &at);
    if (err) return err;
    double score;
    EmqGroupLane *g = &l->gl[at];
    if (!emq_key_empty(&g->lane) && RedisModule_ZsetScore(g->lane.key, id, &score) == REDISMODULE_OK)
        emq_ids_add(&g->leave, id, 0);
    return EMQ_OK;
}

/* 0 place, 1 enter, 2 remove */
static int by_row(EmqLanes *l, RedisModuleString *id, EmqKey *row, int what, int end, long long due, long long now) {
    long long level;
    int err = emq_row_level(row, &level);
    if (err) return err;
    RedisModuleString *group = emq_row_group(row);
    if (what == 0) err = emq_lanes_place_in(l, id, group, level, end);
    else if (what == 1) err = emq_lanes_enter_in(l, id, group, level, due, now);
    else err = emq_lanes_remove_in(l, id, group, level);
    if (group) RedisModule_FreeString(NULL, group);
    return err;
}

int emq_lanes_place_row(EmqLanes *l, RedisModuleString *id, EmqKey *row, int end) {
    return by_row(l, id, row, 0, end, 0, 0);
}

int emq_lanes_enter_row(EmqLanes *l, RedisModuleString *id, EmqKey *row, long long due, long long now) {
    return by_row(l, id, row, 1, EMQ_AT_TAIL, due, now);
}

int emq_lanes_remove_row(EmqLanes *l, RedisModuleString *id, EmqKey *row) {
    return by_row(l, id, row, 2, EMQ_AT_TAIL, 0, 0);
}

int emq_lanes_delay(EmqLanes *l, RedisModuleString *id, long long due) {
    int err = emq_lanes_open(l, EMQ_LANE_DELAYED);
    if (!err) emq_ids_add(&l->delayed_add, id, due);
    return err;
}

int emq_lanes_enter(EmqLanes *l, RedisModuleString *id, long long level, long long due, long long now) {
    return due != now ? emq_lanes_delay(l, id, due) : emq_lanes_place(l, id, level, EMQ_AT_TAIL);
}

int emq_lanes_is_delayed(EmqLanes *l, RedisModuleString *id) {
    double score;
    return (l->opened & EMQ_LANE_DELAYED) && !emq_key_empty(&l->delayed) &&
           RedisModule_ZsetScore(l->delayed.key, id, &score) == REDISMODULE_OK;
}

int emq_lanes_remove(EmqLanes *l, RedisModuleString *id, long long level) {
    int err = emq_lanes_open(l, EMQ_LANE_DELAYED);
    if (err) return err;
    if (emq_lanes_is_delayed(l, id)) {
        emq_ids_add(&l->leave_delayed, id, 0);
        return EMQ_OK;
    }
    if (level != 0) {
        err = emq_lanes_open(l, EMQ_LANE_PRIORITY);
        double score;
        if (!err && !emq_key_empty(&l->priority) &&
            RedisModule_ZsetScore(l->priority.key, id, &score) == REDISMODULE_OK)
            emq_ids_add(&l->leave_priority, id, 0);
        return err;
    }
    /* Its <pending> entry stays, a tombstone the claims drop (O(1) here,
     * where LREM would walk the list). */
    err = emq_lanes_open(l, EMQ_LANE_META);
    if (err) return err;
    if (l->stale == LLONG_MAX) return EMQ_ERR_OVERFLOW; /* HINCRBY's refusal */
    l->stale++;
    l->stale_changed = 1;
    return EMQ_OK;
}

/* A due member's row: is it a pending job, and at which level?  The row is
 * read, never written here: the caller's right to read it is asked first. */
static int promoted_level(EmqLanes *l, RedisModuleString *id, int *pending, long long *level,
                          RedisModuleString **group) {
    RedisModuleString *name = emq_derived_key(l->ctx, l->base, "job:", id);
    EmqKey row;
    int err = emq_open_derived(l->ctx, l->user, &row, name, EMQ_DERIVED_READ);
    if (!err && !emq_type_ok(&row, REDISMODULE_KEYTYPE_HASH)) err = EMQ_ERR_WRONGTYPE;
    *pending = 0;
    if (!err) {
        RedisModuleString *state = emq_hget(&row, emq_str.state);
        *pending = state && emq_str_equal(state, emq_str.pending);
        if (state) RedisModule_FreeString(NULL, state);
        if (*pending) err = emq_row_level(&row, level);
        if (!err && *pending) *group = emq_row_group(&row);
    }
    emq_key_close(&row);
    RedisModule_FreeString(l->ctx, name);
    return err;
}

int emq_lanes_promote(EmqLanes *l, long long now) {
    int err = emq_lanes_open(l, EMQ_LANE_DELAYED);
    if (err || emq_key_empty(&l->delayed)) return err;
    RedisModuleString **ids;
    size_t n = emq_zset_head(&l->delayed, (double)now, EMQ_PROMOTE_MAX, &ids);
    for (size_t i = 0; i < n; i++) {
        int pending = 0;
        long long level = 0;
        RedisModuleString *group = NULL;
        if (!err) err = promoted_level(l, ids[i], &pending, &level, &group);
        if (!err) {
            emq_ids_add(&l->leave_delayed, ids[i], 0);
            if (!pending) {
                l->dropped++;
            } else if (group) {
                l->promoted++;
                err = emq_lanes_place_in(l, ids[i], group, level, EMQ_AT_TAIL);
                long at;
                if (!err) err = emq_lanes_group(l, group, &at);
                if (!err) emq_ids_add(&l->gl[at].promoted, ids[i], l->gl[at].add.scores[l->gl[at].add.n - 1]);
            } else {
                l->promoted++;
                err = emq_lanes_place(l, ids[i], level, EMQ_AT_TAIL);
                if (!err && level == 0) emq_ids_add(&l->promoted_tails, ids[i], 0);
                if (!err && level != 0)
                    emq_ids_add(&l->promoted_priority, ids[i], l->priority_add.scores[l->priority_add.n - 1]);
            }
        }
        if (group) RedisModule_FreeString(NULL, group);
        RedisModule_FreeString(NULL, ids[i]);
    }
    if (ids) RedisModule_Free(ids);
    return err;
}

int emq_lanes_due_left(EmqLanes *l, long long now, long long *next) {
    *next = -1;
    if (!(l->opened & EMQ_LANE_DELAYED) || emq_key_empty(&l->delayed)) return 0;
    /* The members this call moves are the first ones; the one after them
     * is the earliest that stays. */
    long skip = l->promoted + l->dropped;
    int due = 0;
    RedisModule_ZsetFirstInScoreRange(l->delayed.key, -HUGE_VAL, HUGE_VAL, 0, 0);
    while (!RedisModule_ZsetRangeEndReached(l->delayed.key)) {
        if (skip-- > 0) {
            RedisModule_ZsetRangeNext(l->delayed.key);
            continue;
        }
        double score;
        RedisModuleString *id = RedisModule_ZsetRangeCurrentElement(l->delayed.key, &score);
        RedisModule_FreeString(NULL, id);
        long long at = (long long)score;
        if ((double)at < score) at++; /* a fractional score written by hand: the next whole ms */
        if (at <= now) due = 1;
        else *next = at;
        break;
    }
    RedisModule_ZsetRangeStop(l->delayed.key);
    return due;
}

/* Without ListGet (Redis 6.2), <pending> is read a window at a time. */
#define WINDOW 64

static void read_window(EmqLanes *l, long from) {
    drop_window(l);
    l->window_from = from;
    RedisModuleCallReply *reply = RedisModule_Call(l->ctx, "LRANGE", "sll", l->pending->name, (long long)from,
                                                   (long long)(from + WINDOW - 1));
    if (reply == NULL) return;
    size_t n = RedisModule_CallReplyLength(reply);
    l->window = RedisModule_Alloc((n ? n : 1) * sizeof *l->window);
    for (size_t i = 0; i < n; i++)
        l->window[i] = RedisModule_CreateStringFromCallReply(RedisModule_CallReplyArrayElement(reply, i));
    l->window_n = (long)n;
    RedisModule_FreeCallReply(reply);
}

RedisModuleString *emq_lanes_entry(EmqLanes *l, long index) {
    if (RedisModule_KeyType(l->pending->key) != REDISMODULE_KEYTYPE_LIST) return NULL;
    if (index >= (long)RedisModule_ValueLength(l->pending->key)) return NULL;
    if (RedisModule_ListGet) return RedisModule_ListGet(l->pending->key, index);
    if (l->window == NULL || index < l->window_from || index >= l->window_from + l->window_n) read_window(l, index);
    if (index < l->window_from || index >= l->window_from + l->window_n) return NULL;
    RedisModuleString *s = l->window[index - l->window_from];
    RedisModule_RetainString(NULL, s);
    return s;
}

/* The jobs put back at levels other than 0 take their seqs (emq_head_seq):
 * per level, how many this call puts back and the level's first job. */
static void settle_in(EmqKey *set, EmqIds *h, EmqIds *add) {
    if (h->n == 0) return;
    typedef struct {
        long count, seen;
        long long first;
        int has;
    } Level;
    const size_t levels = EMQ_PRIORITY_MAX - EMQ_PRIORITY_MIN + 1;
    Level *at = RedisModule_Alloc(levels * sizeof *at);
    memset(at, 0, levels * sizeof *at);
    for (long i = 0; i < h->n; i++) {
        Level *v = &at[h->scores[i] - EMQ_PRIORITY_MIN];
        if (v->count++ == 0) v->first = edge_seq(set, h->scores[i], 0, &v->has);
    }
    for (long i = 0; i < h->n; i++) {
        Level *v = &at[h->scores[i] - EMQ_PRIORITY_MIN];
        long long seq = emq_head_seq(v->first, v->has, v->count, v->seen++);
        emq_ids_add(add, h->ids[i], emq_priority_score(h->scores[i], seq));
    }
    RedisModule_Free(at);
    emq_ids_free(h);
}

static void settle_heads(EmqLanes *l) {
    settle_in(&l->priority, &l->priority_heads, &l->priority_add);
    for (long i = 0; i < l->ngl; i++) settle_in(&l->gl[i].lane, &l->gl[i].heads, &l->gl[i].add);
}

/* The group lanes' writes, then the ring's, then the groups' flags. */
static void apply_groups(EmqLanes *l, EmqFx *fx) {
    for (long i = 0; i < l->ngl; i++) {
        EmqGroupLane *g = &l->gl[i];
        if (g->add.n) emq_fx_zadd_pairs(fx, &g->lane, g->add.scores, g->add.ids, g->add.n);
        if (g->leave.n) emq_fx_zrem_many(fx, &g->lane, g->leave.ids, g->leave.n);
    }
    if (l->ring_opened && (l->ring_pops || l->ring_push.n > l->ring_push_from)) {
        /* The ring as it is left: what stays of it, then what is pushed; it
         * is deleted when no group is left in it (the empty name alone). */
        long stays = l->ring_len - l->ring_pops, groups = stays - (l->ring_len > 0 && !l->ring_popped_empty);
        long from = l->ring_push_from, n = l->ring_push.n - from;
        for (long i = from; i < l->ring_push.n; i++) {
            size_t len;
            RedisModule_StringPtrLen(l->ring_push.ids[i], &len);
            groups += len > 0;
        }
        if (groups <= 0) {
            if (l->ring_len > 0) emq_fx_del(fx, &l->ring);
        } else {
            if (l->ring_pops) emq_fx_lpop(fx, &l->ring, l->ring_pops);
            if (n > 0) emq_fx_push(fx, &l->ring, 0, l->ring_push.ids + from, n);
        }
        /* <base>meta says whether the ring exists: a claim of a queue that
         * never had a group opens no other key (nor needs the right to). */
        if ((l->opened & EMQ_LANE_META) && (groups > 0) != l->meta_ring) {
            if (groups > 0) emq_fx_hset(fx, &l->meta, "hset", 1, emq_str.ring, emq_fx_number(fx, 1));
            else emq_fx_hdel(fx, &l->meta, emq_str.ring);
        }
    }
    for (long i = 0; i < l->ngl; i++) {
        EmqGroupLane *g = &l->gl[i];
        if (g->enters == g->leaves) continue;
        EmqKey h;
        emq_key_open(l->ctx, &h, g->hash_name, REDISMODULE_READ | REDISMODULE_WRITE);
        int existed = emq_type_ok(&h, REDISMODULE_KEYTYPE_HASH) && !emq_key_empty(&h);
        if (g->enters) emq_fx_hset(fx, &h, "hset", 1, emq_str.ring, emq_fx_number(fx, 1));
        else emq_fx_hdel(fx, &h, emq_str.ring);
        emq_group_index_sync(l->ctx, fx, l->base, g->group, existed, &h);
        emq_key_close(&h);
    }
    for (long i = 0; i < l->ngl; i++)
        if (l->gl[i].held && !l->gl[i].enters) emq_group_settle(l->ctx, fx, l->base, l->gl[i].group, &l->ring);
}

void emq_lanes_apply(EmqLanes *l, EmqFx *fx) {
    settle_heads(l); /* reads <base>priority and the group lanes: before the first write */
    if (l->leave_delayed.n) emq_fx_zrem_many(fx, &l->delayed, l->leave_delayed.ids, l->leave_delayed.n);
    if (l->tails.n) emq_fx_push(fx, l->pending, 0, l->tails.ids, l->tails.n);
    if (l->heads.n) {
        /* LPUSH a b c leaves c first: the first job given back is pushed last. */
        RedisModuleString **rev = RedisModule_Alloc((size_t)l->heads.n * sizeof *rev);
        for (long i = 0; i < l->heads.n; i++) rev[i] = l->heads.ids[l->heads.n - 1 - i];
        emq_fx_push(fx, l->pending, 1, rev, l->heads.n);
        RedisModule_Free(rev);
    }
    if (l->priority_add.n)
        emq_fx_zadd_pairs(fx, &l->priority, l->priority_add.scores, l->priority_add.ids, l->priority_add.n);
    if (l->delayed_add.n)
        emq_fx_zadd_pairs(fx, &l->delayed, l->delayed_add.scores, l->delayed_add.ids, l->delayed_add.n);
    if (l->pops) emq_fx_lpop(fx, l->pending, l->pops);
    if (l->leave_priority.n) emq_fx_zrem_many(fx, &l->priority, l->leave_priority.ids, l->leave_priority.n);
    apply_groups(l, fx);
    if (l->seq_changed && l->stale_changed)
        emq_fx_hset(fx, &l->meta, "hset", 2, emq_str.seq, emq_fx_number(fx, l->seq), emq_str.stale,
                    emq_fx_number(fx, l->stale));
    else if (l->seq_changed)
        emq_fx_hset(fx, &l->meta, "hset", 1, emq_str.seq, emq_fx_number(fx, l->seq));
    else if (l->stale_changed)
        emq_fx_hset(fx, &l->meta, "hset", 1, emq_str.stale, emq_fx_number(fx, l->stale));
}
