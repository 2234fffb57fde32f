/* emq_admin.c -- a queue's settings and its end: EMQ.RETENTION, EMQ.PAUSE,
 * EMQ.RESUME, EMQ.OBLITERATE, EMQ.FORGET.
 *
 * A queue's settings live in <base>meta (a hash; absent = the defaults):
 * `paused` (present = paused) and the retention of finished rows,
 * `done_ttl_ms`, `cancelled_ttl_ms`, `dead_ttl_ms`.  The verbs that finish
 * a job read them (emq_read_meta): COMPLETE, FAIL, CANCEL, RELEASE and
 * SWEEP set a done or cancelled row's PEXPIREAT from them, SWEEP trims the
 * dead past theirs, CLAIM hands out nothing while the queue is paused.
 *
 * The defaults bound memory for a queue that runs forever: a done row
 * lives an hour, a cancelled row a day, so the rows kept are at most the
 * jobs finished in the last hour (or day) -- a rate, not a history.  Dead
 * rows are kept until an operator retries or purges them (or a dead
 * retention is set): a dead job is a decision to make, not garbage, and
 * it is rare by design (<max-attempts> failures or stalls).
 *
 * Ending a queue takes bounded steps: OBLITERATE removes up to <limit>
 * members of its sets with their rows per call, then its settings and
 * metric; the rows in no set (finished ones, kept for their retention)
 * are found by the client with SCAN and deleted by FORGET, which deletes a
 * row only while it is finished -- never a job enqueued again meanwhile. */
#include <math.h>
#include <string.h>

#include "emq.h"

static const char *const PENDING_ONLY[] = {"pending"};
static const char *const ACTIVE_PENDING_DEAD[] = {"active", "pending", "dead"};

/* Open <base>meta for writing (or only reading), checked to be a hash. */
static int open_meta(RedisModuleCtx *ctx, RedisModuleUser *user, RedisModuleString *name, EmqKey *meta,
                     int write) {
    int err = emq_open_derived(ctx, user, meta, name, write ? EMQ_DERIVED_READ_WRITE : EMQ_DERIVED_READ);
    if (!err && !emq_type_ok(meta, REDISMODULE_KEYTYPE_HASH)) err = EMQ_ERR_WRONGTYPE;
    return err;
}

/* ------------------------------------------------------------------------
 * EMQ.RETENTION <pending> <base> [DONE <ms>] [CANCELLED <ms>] [DEAD <ms>]
 *
 * Sets (HSET <base>meta, absolute values) the retention of the queue's
 * finished rows: -1 = keep forever, 0 = delete at once, else ms after the
 * job finished.  Without options it only reads.  Reply: the effective
 * [done, cancelled, dead] after the call.  A field the call sets is only
 * written when it changes; one it does not set must be valid where stored.
 * Rows that finished before keep the expiry they got; the dead retention
 * applies to every dead row at the next SWEEP (it goes by <dead>'s scores).
 * ------------------------------------------------------------------------ */
int EmqRetention_RedisCommand(RedisModuleCtx *ctx, RedisModuleString **argv, int argc) {
    /* parse */
    if (argc < 3) return RedisModule_WrongArity(ctx);
    static const char *const option[3] = {"DONE", "CANCELLED", "DEAD"};
    static const long long fallback[3] = {EMQ_DEFAULT_DONE_TTL_MS, EMQ_DEFAULT_CANCELLED_TTL_MS,
                                          EMQ_DEFAULT_DEAD_TTL_MS};
    RedisModuleString *given[3] = {NULL, NULL, NULL};
    long long value[3] = {fallback[0], fallback[1], fallback[2]};
    int err = EMQ_OK;
    for (int i = 3; i < argc && !err; i += 2) {
        size_t len, vlen;
        const char *opt = RedisModule_StringPtrLen(argv[i], &len);
        int which = -1;
        for (int w = 0; w < 3; w++)
            if (emq_option_is(opt, len, option[w])) which = w;
        if (which < 0 || given[which] || i + 1 >= argc) {
            err = EMQ_ERR_SYNTAX;
            break;
        }
        const char *v = RedisModule_StringPtrLen(argv[i + 1], &vlen);
        err = emq_parse_retention_arg(v, vlen, &value[which]);
        given[which] = argv[i + 1];
    }
    if (!err) err = emq_check_queue(ctx, &argv[1], PENDING_ONLY, 1, argv[2], EMQ_ERR_PENDING_KEY);
    if (err) return emq_reply_error(ctx, err);
    int writes = given[0] || given[1] || given[2];

    /* open and type-check */
    RedisModuleUser *user = NULL;
    EmqKey meta = {0};
    RedisModuleString *meta_name = emq_derived_key(ctx, argv[2], "meta", NULL);
    EmqFx fx;
    emq_fx_begin(&fx, ctx);
    if (!emq_acl_user(ctx, &user)) err = EMQ_ERR_NOPERM_DERIVED;
    else err = open_meta(ctx, user, meta_name, &meta, writes);
    if (err) goto reply;

    /* read and decide */
    RedisModuleString *field[3] = {emq_str.done_ttl_ms, emq_str.cancelled_ttl_ms, emq_str.dead_ttl_ms};
    RedisModuleString *set_field[3], *set_value[3];
    int nset = 0;
    for (int w = 0; w < 3 && !err; w++) {
        RedisModuleString *cur = emq_hget(&meta, field[w]);
        if (given[w] && !(cur && emq_str_equal(cur, given[w]))) {
            set_field[nset] = field[w];
            set_value[nset++] = given[w];
        } else if (!given[w] && cur) {
            size_t len;
            const char *p = RedisModule_StringPtrLen(cur, &len);
            err = emq_parse_retention(p, len, &value[w]);
        }
        if (cur) RedisModule_FreeString(NULL, cur);
    }
    if (err) goto reply;

    /* apply: one HSET of the fields that change */
    if (nset == 1)
        emq_fx_hset(&fx, &meta, "hset", 1, set_field[0], set_value[0]);
    else if (nset == 2)
        emq_fx_hset(&fx, &meta, "hset", 2, set_field[0], set_value[0], set_field[1], set_value[1]);
    else if (nset == 3)
        emq_fx_hset(&fx, &meta, "hset", 3, set_field[0], set_value[0], set_field[1], set_value[1], set_field[2],
                    set_value[2]);

reply:
    if (err) {
        emq_reply_error(ctx, err);
    } else {
        RedisModule_ReplyWithArray(ctx, 3);
        for (int w = 0; w < 3; w++) RedisModule_ReplyWithLongLong(ctx, value[w]);
    }
    emq_fx_commit(&fx);
    emq_key_close(&meta);
    RedisModule_FreeString(ctx, meta_name);
    if (user) RedisModule_FreeModuleUser(user);
    return REDISMODULE_OK;
}

/* ------------------------------------------------------------------------
 * EMQ.PAUSE <pending> <base>   /   EMQ.RESUME <pending> <base>
 *
 * PAUSE sets <base>meta `paused` (HSET paused 1): CLAIM hands out nothing
 * until RESUME deletes it (HDEL) and wakes the claims waiting on the queue.  Everything else goes on: holders extend,
 * checkpoint, complete, fail and release; ENQUEUE adds; SWEEP recovers
 * (the recovered wait).  Reply :1 when the call changed the setting, :0
 * when the queue was already paused (or running): nothing written then.
 * ------------------------------------------------------------------------ */
static int pause_or_resume(RedisModuleCtx *ctx, RedisModuleString **argv, int argc, int pause) {
    /* parse */
    if (argc != 3) return RedisModule_WrongArity(ctx);
    int err = emq_check_queue(ctx, &argv[1], PENDING_ONLY, 1, argv[2], EMQ_ERR_PENDING_KEY);
    if (err) return emq_reply_error(ctx, err);

    /* open and type-check */
    RedisModuleUser *user = NULL;
    EmqKey meta = {0};
    RedisModuleString *meta_name = emq_derived_key(ctx, argv[2], "meta", NULL);
    EmqFx fx;
    emq_fx_begin(&fx, ctx);
    if (!emq_acl_user(ctx, &user)) err = EMQ_ERR_NOPERM_DERIVED;
    else err = open_meta(ctx, user, meta_name, &meta, 1);
    if (err) goto reply;

    /* read, decide, apply */
    int changed = emq_hexists(&meta, emq_str.paused) != pause;
    if (changed && pause) emq_fx_hset(&fx, &meta, "hset", 1, emq_str.paused, emq_small_int[1]);
    if (changed && !pause) emq_fx_hdel(&fx, &meta, emq_str.paused);

reply:
    if (err) emq_reply_error(ctx, err);
    else RedisModule_ReplyWithLongLong(ctx, changed);
    emq_fx_commit(&fx);
    emq_key_close(&meta);
    RedisModule_FreeString(ctx, meta_name);
    /* Claims waiting on the queue (CLAIM ... BLOCK) may claim again. */
    if (!err && changed && !pause) emq_signal_claimable(ctx, argv[1]);
    if (user) RedisModule_FreeModuleUser(user);
    return REDISMODULE_OK;
}

int EmqPause_RedisCommand(RedisModuleCtx *ctx, RedisModuleString **argv, int argc) {
    return pause_or_resume(ctx, argv, argc, 1);
}

int EmqResume_RedisCommand(RedisModuleCtx *ctx, RedisModuleString **argv, int argc) {
    return pause_or_resume(ctx, argv, argc, 0);
}

/* Check that the caller may delete each named key and that each is served
 * here (emq_open_derived), without keeping it open: rows are deleted one at
 * a time later, as an id may be in two sets of a damaged queue and one key
 * must not be open twice while it is deleted. */
static int check_derived(RedisModuleCtx *ctx, RedisModuleUser *user, RedisModuleString **names, size_t n) {
    for (size_t i = 0; i < n; i++) {
        EmqKey k;
        int err = emq_open_derived(ctx, user, &k, names[i], EMQ_DERIVED_DELETE);
        emq_key_close(&k);
        if (err) return err;
    }
    return EMQ_OK;
}

/* DEL one derived key that was checked by check_derived. */
static int del_checked(RedisModuleCtx *ctx, EmqFx *fx, RedisModuleString *name) {
    EmqKey k;
    emq_key_open(ctx, &k, name, REDISMODULE_READ | REDISMODULE_WRITE);
    int existed = !emq_key_empty(&k);
    emq_fx_del(fx, &k);
    emq_key_close(&k);
    return existed;
}

static size_t card(EmqKey *k) {
    return emq_key_empty(k) ? 0 : RedisModule_ValueLength(k->key);
}

/* One member a step of OBLITERATE takes: where from, its row, and whether
 * the row goes with it (a tombstone of <pending> takes no row). */
typedef struct {
    RedisModuleString *id, *row;
    EmqKey *from; /* NULL: an entry of <pending> */
    int deletes, ended;
} Doomed;

/* ------------------------------------------------------------------------
 * EMQ.OBLITERATE <active> <pending> <dead> <base> <limit> [FORCE]
 *
 * Removes up to <limit> entries of <pending>, then members of
 * <base>priority, <base>delayed, <dead>, then <active> (with FORCE), and
 * DELetes their rows (a tombstone of <pending> has none: it only leaves,
 * counted off `stale`).  While members remain after a call, the queue is
 * paused (meta `paused`), so no claim takes a job of a queue half deleted;
 * the call that leaves them all empty also deletes <base>meta and
 * <base>metrics:failed.  Reply [removed, remaining]: the jobs removed by
 * this call (its tombstones not counted), and the entries and members left
 * (tombstones counted: the step that reaches 0 is the last).  -EMQBUSY when <active> is not
 * empty and FORCE is not given: nothing written.  Rows in no set (done and
 * cancelled, kept for their retention) are EMQ.FORGET's.  A job deleted
 * before it ended is announced on <base>done:<id>.
 * ------------------------------------------------------------------------ */
int EmqObliterate_RedisCommand(RedisModuleCtx *ctx, RedisModuleString **argv, int argc) {
    /* parse */
    if (argc != 6 && argc != 7) return RedisModule_WrongArity(ctx);
    int force = 0;
    if (argc == 7) {
        size_t len;
        const char *opt = RedisModule_StringPtrLen(argv[6], &len);
        if (!emq_option_is(opt, len, "FORCE")) return emq_reply_error(ctx, EMQ_ERR_SYNTAX);
        force = 1;
    }
    long long limit = 0;
    size_t limit_len;
    const char *limit_arg = RedisModule_StringPtrLen(argv[5], &limit_len);
    int err = emq_check_queue(ctx, &argv[1], ACTIVE_PENDING_DEAD, 3, argv[4], EMQ_ERR_THREE_SETS);
    if (!err) err = emq_parse_limit(limit_arg, limit_len, emq_config_max_limit(), &limit);
    if (err) return emq_reply_error(ctx, err);

    /* open and type-check */
    const int rw = REDISMODULE_READ | REDISMODULE_WRITE;
    RedisModuleUser *user = NULL;
    EmqKey active, pending, dead;
    emq_key_open(ctx, &active, argv[1], rw);
    emq_key_open(ctx, &pending, argv[2], rw);
    emq_key_open(ctx, &dead, argv[3], rw);
    RedisModuleString *metrics_name = emq_derived_key(ctx, argv[4], "metrics:failed", NULL);
    RedisModuleString *registry_name = emq_registry_name(ctx, argv[4]);
    Doomed *d = NULL;
    RedisModuleDict *live = NULL;
    size_t n = 0, entries = 0, tombstones = 0;
    EmqFx fx;
    emq_fx_begin(&fx, ctx);
    EmqLanes lanes;
    emq_lanes_init(&lanes, ctx, NULL, argv[4], &pending);
    EmqEnd end;
    emq_end_init(&end, ctx, argv[4]);
    if (!emq_type_ok(&active, REDISMODULE_KEYTYPE_ZSET) || !emq_type_ok(&pending, REDISMODULE_KEYTYPE_LIST) ||
        !emq_type_ok(&dead, REDISMODULE_KEYTYPE_ZSET))
        err = EMQ_ERR_WRONGTYPE;
    if (!err && !force && !emq_key_empty(&active)) err = EMQ_ERR_BUSY;
    if (!err && !emq_acl_user(ctx, &user)) err = EMQ_ERR_NOPERM_DERIVED;
    lanes.user = user;
    if (!err) err = emq_lanes_open(&lanes, EMQ_LANE_PRIORITY | EMQ_LANE_DELAYED);
    /* The group lanes are found from the ring: a group whose lane holds a
     * job is in it (O(groups waiting) a step). */
    if (!err) {
        RedisModuleString *meta_name = emq_derived_key(ctx, argv[4], "meta", NULL);
        EmqKey meta;
        err = emq_open_derived(ctx, user, &meta, meta_name, EMQ_DERIVED_READ);
        if (!err && emq_type_ok(&meta, REDISMODULE_KEYTYPE_HASH) && emq_hexists(&meta, emq_str.ring))
            err = emq_lanes_open_ring(&lanes);
        emq_key_close(&meta);
        RedisModule_FreeString(ctx, meta_name);
    }
    for (long i = 0; !err && i < lanes.ring_len; i++) {
        RedisModuleString *m = emq_lanes_ring_at(&lanes, i);
        size_t mlen = 0;
        if (m) RedisModule_StringPtrLen(m, &mlen);
        long at;
        if (mlen > 0) err = emq_lanes_group(&lanes, m, &at);
        if (m) RedisModule_FreeString(NULL, m);
    }
    /* then the index's (emq_group.h): a group held out of the ring by its
     * cap or its pause has its lane too */
    if (!err) err = emq_group_index_check(ctx, user, argv[4]);
    if (!err) {
        RedisModuleString *index = emq_derived_key(ctx, argv[4], "groupset", NULL);
        RedisModuleCallReply *r = RedisModule_Call(ctx, "ZRANGE", "sll", index, 0LL, -1LL);
        size_t k = r && RedisModule_CallReplyType(r) == REDISMODULE_REPLY_ARRAY ? RedisModule_CallReplyLength(r) : 0;
        for (size_t i = 0; !err && i < k; i++) {
            RedisModuleString *m = RedisModule_CreateStringFromCallReply(RedisModule_CallReplyArrayElement(r, i));
            long at;
            err = emq_lanes_group(&lanes, m, &at);
            RedisModule_FreeString(NULL, m);
        }
        if (r) RedisModule_FreeCallReply(r);
        RedisModule_FreeString(ctx, index);
    }
    if (err) goto reply;

    /* read: the entries and members this call takes, <pending> first, the
     * held last; every row it reads or deletes is checked first */
    size_t total = card(&pending) + card(&lanes.priority) + card(&lanes.delayed) + card(&dead) + card(&active);
    for (long i = 0; i < lanes.ngl; i++) total += (size_t)lanes.gl[i].card;
    d = RedisModule_Alloc(((size_t)limit < total ? (size_t)limit : total) * sizeof *d + sizeof *d);
    /* The ids of <pending> whose rows this call deletes: a later entry of the
     * same id is a tombstone (O(log n) a lookup, where a scan of the entries
     * before it made a 100,000-entry call take half a minute). */
    live = RedisModule_CreateDict(NULL);
    for (; (long long)n < limit; n++, entries++) {
        RedisModuleString *id = emq_lanes_entry(&lanes, (long)entries);
        if (id == NULL) break;
        d[n] = (Doomed){.id = id, .row = emq_derived_key(ctx, argv[4], "job:", id)};
        EmqKey row;
        err = emq_open_derived(ctx, user, &row, d[n].row, EMQ_DERIVED_READ_DELETE);
        if (!err && !emq_type_ok(&row, REDISMODULE_KEYTYPE_HASH)) err = EMQ_ERR_WRONGTYPE;
        if (!err) {
            RedisModuleString *state = emq_hget(&row, emq_str.state);
            int pending_state = state && emq_str_equal(state, emq_str.pending), seen = 0;
            if (state) RedisModule_FreeString(NULL, state);
            size_t id_len;
            const char *id_ptr = RedisModule_StringPtrLen(id, &id_len);
            RedisModule_DictGetC(live, (void *)id_ptr, id_len, &seen);
            seen = !seen; /* DictGetC's flag says "no such key" */
            d[n].deletes = emq_entry_live(!emq_key_empty(&row), pending_state, emq_hexists(&row, emq_str.priority),
                                          emq_lanes_is_delayed(&lanes, id), seen);
            if (d[n].deletes) RedisModule_DictSetC(live, (void *)id_ptr, id_len, NULL);
            d[n].ended = 0;
            tombstones += !d[n].deletes;
        }
        emq_key_close(&row);
        if (err) {
            n++;
            goto reply;
        }
    }
    EmqKey *sets[4] = {&lanes.priority, &lanes.delayed, &dead, &active};
    for (int s = 0; s < 4 && (long long)n < limit; s++) {
        RedisModuleString **got;
        size_t k = emq_zset_head(sets[s], HUGE_VAL, limit - (long long)n, &got);
        for (size_t i = 0; i < k; i++, n++)
            d[n] = (Doomed){.id = got[i], .row = emq_derived_key(ctx, argv[4], "job:", got[i]), .from = sets[s],
                            .deletes = 1, .ended = sets[s] == &dead};
        if (got) RedisModule_Free(got);
    }
    for (long g = 0; g < lanes.ngl && (long long)n < limit; g++) {
        RedisModuleString **got;
        EmqKey *lane = &lanes.gl[g].lane;
        size_t k = emq_zset_head(lane, HUGE_VAL, limit - (long long)n, &got);
        for (size_t i = 0; i < k; i++, n++)
            d[n] = (Doomed){.id = got[i], .row = emq_derived_key(ctx, argv[4], "job:", got[i]), .from = lane,
                            .deletes = 1};
        if (got) RedisModule_Free(got);
    }
    size_t remaining = total - n;

    /* decide: every key this call deletes or writes is checked first */
    for (size_t i = 0; !err && i < n; i++) {
        if (d[i].from == NULL) continue; /* read above, with the right to delete it */
        RedisModuleString *row = d[i].row;
        err = check_derived(ctx, user, &row, 1);
    }
    for (size_t i = 0; !err && i < n; i++) {
        if (d[i].from == &active) err = emq_left_active_prepare(&end, d[i].id, NULL);
        if (!err && d[i].deletes) err = emq_ended_prepare(&end, d[i].id, EMQ_END_DELETED, d[i].ended);
    }
    if (!err && remaining == 0) err = check_derived(ctx, user, &metrics_name, 1);
    if (!err && remaining == 0) err = check_derived(ctx, user, &registry_name, 1); /* emq_registry.h */
    /* The step that empties the sets deletes <base>meta (whatever it holds:
     * a meta of the wrong type cannot be paused, but it can be deleted);
     * the others pause the queue in it, and count off the tombstones. */
    if (!err && remaining == 0) {
        lanes.meta_name = emq_derived_key(ctx, argv[4], "meta", NULL);
        lanes.opened |= EMQ_LANE_META;
        err = emq_open_derived(ctx, user, &lanes.meta, lanes.meta_name, EMQ_DERIVED_DELETE);
    } else if (!err) {
        err = emq_lanes_open(&lanes, EMQ_LANE_META);
        long long stale = lanes.stale > (long long)tombstones ? lanes.stale - (long long)tombstones : 0;
        if (!err && stale != lanes.stale) {
            lanes.stale = stale;
            lanes.stale_changed = 1;
        }
    }
    if (err) goto reply;

    /* apply: the entries of <pending> in one LPOP, then member by member */
    emq_fx_lpop(&fx, &pending, (long)entries);
    /* A group whose active job this step takes off is settled after the
     * lanes' writes (a step that is not the last: the ring stays exact), or
     * not at all (the last step deletes the ring). */
    end.groups.defer_settle = 1;
    for (size_t i = 0; i < n; i++) {
        if (d[i].from) emq_fx_zrem(&fx, d[i].from, d[i].id);
        if (d[i].from == &active) emq_left_active_apply(&end, &fx, d[i].id);
        if (d[i].deletes) {
            del_checked(ctx, &fx, d[i].row);
            emq_ended_apply(&end, &fx, d[i].id, EMQ_END_DELETED, d[i].ended);
        }
    }
    if (remaining == 0) {
        emq_fx_del(&fx, &lanes.meta);
        del_checked(ctx, &fx, metrics_name);
        del_checked(ctx, &fx, registry_name);
        /* the ring, and its groups' flags */
        if (lanes.ring_len > 0) emq_fx_del(&fx, &lanes.ring);
        for (long g = 0; g < lanes.ngl; g++) {
            EmqKey h;
            emq_key_open(ctx, &h, lanes.gl[g].hash_name, REDISMODULE_READ | REDISMODULE_WRITE);
            int existed = emq_type_ok(&h, REDISMODULE_KEYTYPE_HASH) && !emq_key_empty(&h);
            if (existed) emq_fx_hdel(&fx, &h, emq_str.ring);
            emq_group_index_sync(ctx, &fx, argv[4], lanes.gl[g].group, existed, &h);
            emq_key_close(&h);
        }
    } else {
        if (!emq_hexists(&lanes.meta, emq_str.paused))
            emq_fx_hset(&fx, &lanes.meta, "hset", 1, emq_str.paused, emq_small_int[1]);
        emq_lanes_apply(&lanes, &fx);
        emq_groups_settle_deferred(&end.groups, &fx);
    }

reply:
    if (err) {
        emq_reply_error(ctx, err);
    } else {
        RedisModule_ReplyWithArray(ctx, 2);
        RedisModule_ReplyWithLongLong(ctx, (long long)(n - tombstones)); /* the jobs: a tombstone is none */
        RedisModule_ReplyWithLongLong(ctx, (long long)remaining);
    }
    emq_fx_commit(&fx);
    for (size_t i = 0; i < n; i++) {
        RedisModule_FreeString(ctx, d[i].id);
        RedisModule_FreeString(ctx, d[i].row);
    }
    if (d) RedisModule_Free(d);
    if (live) RedisModule_FreeDict(NULL, live);
    emq_end_close(&end);
    emq_lanes_close(&lanes);
    RedisModule_FreeString(ctx, metrics_name);
    RedisModule_FreeString(ctx, registry_name);
    emq_key_close(&dead);
    emq_key_close(&pending);
    emq_key_close(&active);
    if (user) RedisModule_FreeModuleUser(user);
    return REDISMODULE_OK;
}

/* ------------------------------------------------------------------------
 * EMQ.FORGET <pending> <base> <id> [<id> ...]
 *
 * DELetes each row <base>job:<id> whose state is done or cancelled (a
 * finished job in no set), or waiting (for its dependencies, in no set
 * either: it leaves their waiter sets, and what waits on it resolves as
 * `deleted`, emq_deps.h); other rows and absent ones are left alone.
 * Reply :<n>, the rows deleted.  What obliterate's SCAN finds, it deletes
 * through this: a job enqueued again after its row was found is pending,
 * so it is not deleted.
 * ------------------------------------------------------------------------ */
int EmqForget_RedisCommand(RedisModuleCtx *ctx, RedisModuleString **argv, int argc) {
    /* parse */
    if (argc < 4) return RedisModule_WrongArity(ctx);
    int err = emq_check_queue(ctx, &argv[1], PENDING_ONLY, 1, argv[2], EMQ_ERR_PENDING_KEY);
    if (!err && (long long)argc - 3 > emq_config_max_limit()) err = EMQ_ERR_FORGET_TOO_MANY;
    if (err) return emq_reply_error(ctx, err);
    size_t n = (size_t)argc - 3;

    /* open, type-check, read and decide, one row at a time (an id may be
     * named twice) */
    RedisModuleUser *user = NULL;
    RedisModuleString **rows = RedisModule_Alloc(n * sizeof *rows);
    int *forget = RedisModule_Alloc(n * sizeof *forget);
    for (size_t i = 0; i < n; i++) rows[i] = emq_derived_key(ctx, argv[2], "job:", argv[3 + i]);
    EmqFx fx;
    emq_fx_begin(&fx, ctx);
    long long deleted = 0;
    if (!emq_acl_user(ctx, &user)) err = EMQ_ERR_NOPERM_DERIVED;
    for (size_t i = 0; i < n && !err; i++) {
        EmqKey row;
        err = emq_open_derived(ctx, user, &row, rows[i], EMQ_DERIVED_READ_DELETE);
        if (!err && !emq_type_ok(&row, REDISMODULE_KEYTYPE_HASH)) err = EMQ_ERR_WRONGTYPE;
        RedisModuleString *state = err ? NULL : emq_hget(&row, emq_str.state);
        size_t len = 0;
        const char *s = state ? RedisModule_StringPtrLen(state, &len) : NULL;
        forget[i] = emq_forget_deletes_row(s, len) ? 1 : state && emq_str_equal(state, emq_str.waiting) ? 2 : 0;
        if (state) RedisModule_FreeString(NULL, state);
        emq_key_close(&row);
    }

    /* The rows deleted are of jobs that ended (the `ended` hook's deletion
     * steps run, emq_end.h) or that waited (all of its steps: it vanishes
     * before it ended). */
    EmqEnd end;
    emq_end_init(&end, ctx, argv[2]);
    for (size_t i = 0; i < n && !err; i++)
        if (forget[i]) err = emq_ended_prepare(&end, argv[3 + i], EMQ_END_DELETED, forget[i] == 1);

    /* apply */
    for (size_t i = 0; i < n && !err; i++) {
        if (!forget[i]) continue;
        long long gone = del_checked(ctx, &fx, rows[i]);
        deleted += gone;
        /* an id named twice: the second finds no row, and its end ran once */
        if (gone || forget[i] == 1) emq_ended_apply(&end, &fx, argv[3 + i], EMQ_END_DELETED, forget[i] == 1);
    }
    emq_end_close(&end);

    if (err) emq_reply_error(ctx, err);
    else RedisModule_ReplyWithLongLong(ctx, deleted);
    emq_fx_commit(&fx);
    for (size_t i = 0; i < n; i++) RedisModule_FreeString(ctx, rows[i]);
    RedisModule_Free(rows);
    RedisModule_Free(forget);
    if (user) RedisModule_FreeModuleUser(user);
    return REDISMODULE_OK;
}
