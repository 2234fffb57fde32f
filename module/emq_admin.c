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

static size_t zcard(EmqKey *set) {
    return emq_key_empty(set) ? 0 : RedisModule_ValueLength(set->key);
}

/* ------------------------------------------------------------------------
 * EMQ.OBLITERATE <active> <pending> <dead> <base> <limit> [FORCE]
 *
 * Removes up to <limit> members of <pending>, then <dead>, then <active>
 * (with FORCE) and DELetes their rows.  While members remain after a call,
 * the queue is paused (meta `paused`), so no claim takes a job of a queue
 * half deleted; the call that leaves the three sets empty also deletes
 * <base>meta and <base>metrics:failed.  Reply [removed, remaining]:
 * members removed by this call, members left in the three sets.
 * -EMQBUSY when <active> is not empty and FORCE is not given: nothing
 * written.  Rows in no set (done and cancelled, kept for their retention)
 * are EMQ.FORGET's.
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
    EmqKey set[3], meta = {0};
    EmqKey *active = &set[0], *pending = &set[1], *dead = &set[2];
    for (int i = 0; i < 3; i++) emq_key_open(ctx, &set[i], argv[1 + i], rw);
    RedisModuleString *meta_name = emq_derived_key(ctx, argv[4], "meta", NULL);
    RedisModuleString *metrics_name = emq_derived_key(ctx, argv[4], "metrics:failed", NULL);
    RedisModuleString **ids = NULL, **rows = NULL;
    EmqKey **from = NULL;
    size_t n = 0;
    EmqFx fx;
    emq_fx_begin(&fx, ctx);
    for (int i = 0; i < 3 && !err; i++)
        if (!emq_type_ok(&set[i], REDISMODULE_KEYTYPE_ZSET)) err = EMQ_ERR_WRONGTYPE;
    if (!err && !force && !emq_key_empty(active)) err = EMQ_ERR_BUSY;
    if (!err && !emq_acl_user(ctx, &user)) err = EMQ_ERR_NOPERM_DERIVED;
    if (err) goto reply;

    /* read: the members this call takes, pending first, the held last */
    EmqKey *order[3] = {pending, dead, active};
    RedisModuleString **got[3];
    size_t k[3];
    for (int s = 0; s < 3; s++) {
        k[s] = emq_zset_head(order[s], HUGE_VAL, limit - (long long)n, &got[s]);
        n += k[s];
    }
    ids = RedisModule_Alloc((n ? n : 1) * sizeof *ids);
    from = RedisModule_Alloc((n ? n : 1) * sizeof *from);
    for (size_t s = 0, at = 0; s < 3; s++) {
        for (size_t i = 0; i < k[s]; i++, at++) {
            ids[at] = got[s][i];
            from[at] = order[s];
        }
        if (got[s]) RedisModule_Free(got[s]);
    }
    rows = RedisModule_Alloc((n ? n : 1) * sizeof *rows);
    for (size_t i = 0; i < n; i++) rows[i] = emq_derived_key(ctx, argv[4], "job:", ids[i]);
    size_t remaining = zcard(active) + zcard(pending) + zcard(dead) - n;

    /* decide: every key this call deletes or writes is checked first */
    err = check_derived(ctx, user, rows, n);
    if (!err && remaining == 0) err = check_derived(ctx, user, &metrics_name, 1);
    /* The step that empties the sets deletes <base>meta (whatever it holds:
     * a meta of the wrong type cannot be paused, but it can be deleted);
     * the others pause the queue in it. */
    if (!err && remaining == 0) err = emq_open_derived(ctx, user, &meta, meta_name, EMQ_DERIVED_DELETE);
    else if (!err) err = open_meta(ctx, user, meta_name, &meta, 1);
    if (err) goto reply;

    /* apply */
    for (size_t i = 0; i < n; i++) {
        emq_fx_zrem(&fx, from[i], ids[i]);
        del_checked(ctx, &fx, rows[i]);
    }
    if (remaining == 0) {
        emq_fx_del(&fx, &meta);
        del_checked(ctx, &fx, metrics_name);
    } else if (!emq_hexists(&meta, emq_str.paused)) {
        emq_fx_hset(&fx, &meta, "hset", 1, emq_str.paused, emq_small_int[1]);
    }

reply:
    if (err) {
        emq_reply_error(ctx, err);
    } else {
        RedisModule_ReplyWithArray(ctx, 2);
        RedisModule_ReplyWithLongLong(ctx, (long long)n);
        RedisModule_ReplyWithLongLong(ctx, (long long)remaining);
    }
    emq_fx_commit(&fx);
    for (size_t i = 0; i < n; i++) {
        RedisModule_FreeString(ctx, ids[i]);
        if (rows) RedisModule_FreeString(ctx, rows[i]);
    }
    RedisModule_Free(ids);
    RedisModule_Free(rows);
    RedisModule_Free(from);
    emq_key_close(&meta);
    RedisModule_FreeString(ctx, meta_name);
    RedisModule_FreeString(ctx, metrics_name);
    for (int i = 2; i >= 0; i--) emq_key_close(&set[i]);
    if (user) RedisModule_FreeModuleUser(user);
    return REDISMODULE_OK;
}

/* ------------------------------------------------------------------------
 * EMQ.FORGET <pending> <base> <id> [<id> ...]
 *
 * DELetes each row <base>job:<id> whose state is done or cancelled (a
 * finished job in no set); other rows and absent ones are left alone.
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
        forget[i] = emq_forget_deletes_row(s, len);
        if (state) RedisModule_FreeString(NULL, state);
        emq_key_close(&row);
    }

    /* apply */
    for (size_t i = 0; i < n && !err; i++)
        if (forget[i]) deleted += del_checked(ctx, &fx, rows[i]);

    if (err) emq_reply_error(ctx, err);
    else RedisModule_ReplyWithLongLong(ctx, deleted);
    emq_fx_commit(&fx);
    for (size_t i = 0; i < n; i++) RedisModule_FreeString(ctx, rows[i]);
    RedisModule_Free(rows);
    RedisModule_Free(forget);
    if (user) RedisModule_FreeModuleUser(user);
    return REDISMODULE_OK;
}
