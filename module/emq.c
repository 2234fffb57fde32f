/* emq.c -- EchoMQ lifecycle controls as native Redis commands.
 *
 * A worker that holds a job checkpoints its lease (EMQ.EXTEND); abandoned
 * jobs come back and poison jobs are dead-lettered (EMQ.SWEEP).  Two facts
 * carry the whole design:
 *
 *   - The lease IS the active set's score: a member of <base>active scored
 *     with the deadline in server milliseconds.  There is no lock key.
 *   - The fencing token IS the job row's `attempts` field: every claim bumps
 *     it, so a holder from an earlier attempt can never touch the job again.
 *
 * Both commands read the server clock once, validate every argument, key
 * type and row before the first write (a command that answers an error has
 * changed nothing), use the low-level key API, and propagate their effects
 * with absolute values -- never the command itself -- so a replica or an AOF
 * replay never reads a clock of its own.
 *
 * This file holds EXTEND (and CHECKPOINT, which is EXTEND with remote-cancel
 * delivery) and SWEEP, and registers every command.  The rest of a job's
 * life -- ENQUEUE, CLAIM, COMPLETE, FAIL -- is in emq_lifecycle.c, CANCEL in
 * emq_cancel.c, the helpers they share in emq_glue.c.  The decisions that
 * need no server (number parsing, deadline arithmetic, key derivation, the
 * stall threshold) live in emq_core.c, tested in-process through cffi. */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "emq_cancel.h"
#include "emq_core.h"
#include "emq_glue.h"
#include "emq_lifecycle.h"
#include "emq_rm.h"

#define EMQ_MODULE_VERSION 1

static const char *str_bytes(RedisModuleString *s, size_t *len) {
    return RedisModule_StringPtrLen(s, len);
}

/* Field names, values and small counts every call uses, made once at load:
 * a C-string field (REDISMODULE_HASH_CFIELDS, a "c" in a Replicate format)
 * costs an allocation per use, and in a 100,000-job sweep those per-job
 * allocations were about a sixth of the command's instructions (callgrind). */
static RedisModuleString *str_attempts, *str_xx, *str_stalled, *str_state, *str_last_error,
    *str_pending, *str_dead, *str_count, *str_cancel_requested;
#define EMQ_SMALL_INTS 64
static RedisModuleString *small_ints[EMQ_SMALL_INTS];

static RedisModuleString *const_string(const char *s) {
    return RedisModule_CreateString(NULL, s, strlen(s));
}

static void create_shared_strings(void) {
    str_attempts = const_string("attempts");
    str_xx = const_string("XX");
    str_stalled = const_string("stalled");
    str_state = const_string("state");
    str_last_error = const_string("last_error");
    str_pending = const_string("pending");
    str_dead = const_string("dead");
    str_count = const_string("count");
    str_cancel_requested = const_string("cancel_requested");
    for (int i = 0; i < EMQ_SMALL_INTS; i++) {
        char buf[4];
        int n = snprintf(buf, sizeof buf, "%d", i);
        small_ints[i] = RedisModule_CreateString(NULL, buf, (size_t)n);
    }
}

static void free_shared_strings(void) {
    RedisModuleString **all[] = {&str_attempts, &str_xx,      &str_stalled, &str_state,
                                 &str_last_error, &str_pending, &str_dead,    &str_count,
                                 &str_cancel_requested};
    for (size_t i = 0; i < sizeof all / sizeof *all; i++) {
        if (*all[i]) RedisModule_FreeString(NULL, *all[i]);
        *all[i] = NULL;
    }
    for (int i = 0; i < EMQ_SMALL_INTS; i++) {
        if (small_ints[i]) RedisModule_FreeString(NULL, small_ints[i]);
        small_ints[i] = NULL;
    }
}

/* ------------------------------------------------------------------------
 * EMQ.EXTEND <active> <job> <id> <token> <lease-ms>
 *
 * :1 the lease now ends at server-now + lease-ms; :-1 the row is gone;
 * -EMQSTALE the token is not the row's attempts, or <id> is no longer active.
 *
 * EMQ.CHECKPOINT <active> <job> <id> <token> <lease-ms>
 *
 * The same command for holders that want remote cancels delivered
 * (EMQ.CANCEL, emq_cancel.c): on success it answers [1, reason], the stored
 * cancel request or null, instead of :1.
 * ------------------------------------------------------------------------ */
static int extend_lease(RedisModuleCtx *ctx, RedisModuleString **argv, int argc, int with_cancel) {
    if (argc != 6) return RedisModule_WrongArity(ctx);
    RedisModuleString *active_name = argv[1], *job_name = argv[2], *id = argv[3],
                      *token = argv[4];

    /* Opening one key twice with WRITE is undefined in the module API. */
    if (emq_str_equal(active_name, job_name))
        return RedisModule_ReplyWithError(ctx, "ERR <active> and <job> must be different keys");

    size_t lease_len;
    const char *lease = str_bytes(argv[5], &lease_len);
    long long deadline;
    const char *err = emq_lease_deadline(RedisModule_Milliseconds(), lease, lease_len, &deadline);
    if (err) return RedisModule_ReplyWithError(ctx, err);

    RedisModuleKey *active = RedisModule_OpenKey(ctx, active_name, REDISMODULE_READ | REDISMODULE_WRITE);
    RedisModuleKey *job = RedisModule_OpenKey(ctx, job_name, REDISMODULE_READ);
    int reply;
    if (!emq_type_ok(active, REDISMODULE_KEYTYPE_ZSET) || !emq_type_ok(job, REDISMODULE_KEYTYPE_HASH)) {
        reply = RedisModule_ReplyWithError(ctx, REDISMODULE_ERRORMSG_WRONGTYPE);
        goto done;
    }

    RedisModuleString *attempts = NULL;
    if (RedisModule_KeyType(job) == REDISMODULE_KEYTYPE_HASH)
        RedisModule_HashGet(job, REDISMODULE_HASH_NONE, str_attempts, &attempts, NULL);
    if (attempts == NULL) {
        reply = RedisModule_ReplyWithLongLong(ctx, -1);
        goto done;
    }
    int same_holder = emq_str_equal(attempts, token);
    RedisModule_FreeString(ctx, attempts);
    if (!same_holder) {
        reply = RedisModule_ReplyWithError(ctx, "EMQSTALE extend token mismatch");
        goto done;
    }

    /* The token still matches until the next claim, but a sweep may already
     * have taken the job: re-adding it would hand a recovered or dead job
     * back to a holder that lost it (and the next sweep would count it
     * twice).  Only a member that is still active may be extended.
     *
     * ZADD XX is the membership check and the write in one lookup: it
     * answers NOP, and changes nothing, when <id> is not a member.  An
     * absent <active> is not handed to ZsetAdd at all (it would create the
     * key before finding nothing to update). */
    int zflags = REDISMODULE_ZADD_XX;
    if (RedisModule_KeyType(active) == REDISMODULE_KEYTYPE_EMPTY ||
        RedisModule_ZsetAdd(active, (double)deadline, id, &zflags) != REDISMODULE_OK ||
        (zflags & REDISMODULE_ZADD_NOP)) {
        reply = RedisModule_ReplyWithError(ctx, "EMQSTALE job is no longer active");
        goto done;
    }
    /* As core ZADD does: a deadline equal to the current score changes
     * nothing, so nothing is propagated and no event fires. */
    if (zflags & REDISMODULE_ZADD_UPDATED) {
        RedisModule_Replicate(ctx, "ZADD", "ssls", active_name, str_xx, deadline, id);
        RedisModule_NotifyKeyspaceEvent(ctx, REDISMODULE_NOTIFY_ZSET, "zadd", active_name);
    }
    if (!with_cancel) {
        reply = RedisModule_ReplyWithLongLong(ctx, 1);
        goto done;
    }
    RedisModuleString *reason = NULL;
    RedisModule_HashGet(job, REDISMODULE_HASH_NONE, str_cancel_requested, &reason, NULL);
    RedisModule_ReplyWithArray(ctx, 2);
    RedisModule_ReplyWithLongLong(ctx, 1);
    if (reason) {
        reply = RedisModule_ReplyWithString(ctx, reason);
        RedisModule_FreeString(ctx, reason);
    } else {
        reply = RedisModule_ReplyWithNull(ctx);
    }

done:
    RedisModule_CloseKey(job);
    RedisModule_CloseKey(active);
    return reply;
}

static int EmqExtend_RedisCommand(RedisModuleCtx *ctx, RedisModuleString **argv, int argc) {
    return extend_lease(ctx, argv, argc, 0);
}

static int EmqCheckpoint_RedisCommand(RedisModuleCtx *ctx, RedisModuleString **argv, int argc) {
    return extend_lease(ctx, argv, argc, 1);
}

/* ------------------------------------------------------------------------
 * EMQ.SWEEP <active> <pending> <dead> <base> <max-stalled> <limit>
 *
 * Takes the members of <active> whose lease has lapsed (score <= server-now),
 * lowest score first, at most <limit>.  Each stall is counted on the row;
 * at <max-stalled> the job is dead-lettered, below it goes back to pending
 * at score 0 (ahead of newer work).  Reply: [recovered ids, dead ids].
 * ------------------------------------------------------------------------ */

/* One lapsed job: its id, its row, and what the sweep decided for it. */
typedef struct {
    RedisModuleString *id;
    RedisModuleString *row_name;
    RedisModuleKey *row;
    long long stalled;
    int dead;
} SweptJob;

typedef struct {
    RedisModuleCtx *ctx;
    SweptJob *jobs;
    size_t count, cap;
    RedisModuleKey *active, *pending, *dead, *metrics;
    RedisModuleString *metrics_name;
    long long failed_before; /* the metric's count before this sweep */
    RedisModuleUser *user;   /* the caller, for the derived keys' ACL; NULL: no check */
    char *namebuf;           /* scratch for derived key names, reused for every row */
    size_t namecap;
} Sweep;

static void sweep_release(Sweep *s) {
    for (size_t i = 0; i < s->count; i++) {
        if (s->jobs[i].row) RedisModule_CloseKey(s->jobs[i].row);
        if (s->jobs[i].row_name) RedisModule_FreeString(s->ctx, s->jobs[i].row_name);
        RedisModule_FreeString(s->ctx, s->jobs[i].id);
    }
    RedisModule_Free(s->jobs);
    if (s->metrics) RedisModule_CloseKey(s->metrics);
    if (s->metrics_name) RedisModule_FreeString(s->ctx, s->metrics_name);
    if (s->dead) RedisModule_CloseKey(s->dead);
    if (s->pending) RedisModule_CloseKey(s->pending);
    if (s->active) RedisModule_CloseKey(s->active);
    if (s->user) RedisModule_FreeModuleUser(s->user);
    RedisModule_Free(s->namebuf);
}

static RedisModuleString *derived_key(Sweep *s, const char *base, size_t baselen,
                                      const char *mid, const char *tail, size_t taillen) {
    size_t midlen = strlen(mid), len = baselen + midlen + taillen;
    if (len > s->namecap) {
        s->namecap = len > 2 * s->namecap ? len : 2 * s->namecap;
        s->namebuf = RedisModule_Realloc(s->namebuf, s->namecap);
    }
    if (baselen) memcpy(s->namebuf, base, baselen);
    memcpy(s->namebuf + baselen, mid, midlen);
    if (taillen) memcpy(s->namebuf + baselen + midlen, tail, taillen);
    return RedisModule_CreateString(s->ctx, s->namebuf, len);
}

/* Collect the lapsed members and name their rows.  The range iterator must
 * be closed before the set is modified, so the ids are copied out first. */
static void sweep_collect(Sweep *s, const char *base, size_t baselen, long long now,
                          long long limit) {
    if (RedisModule_KeyType(s->active) == REDISMODULE_KEYTYPE_EMPTY) return;
    RedisModule_ZsetFirstInScoreRange(s->active, -HUGE_VAL, (double)now, 0, 0);
    while (!RedisModule_ZsetRangeEndReached(s->active) && (long long)s->count < limit) {
        if (s->count == s->cap) {
            s->cap = s->cap ? s->cap * 2 : 16;
            s->jobs = RedisModule_Realloc(s->jobs, s->cap * sizeof *s->jobs);
        }
        SweptJob *j = &s->jobs[s->count++];
        memset(j, 0, sizeof *j);
        double score;
        size_t idlen;
        j->id = RedisModule_ZsetRangeCurrentElement(s->active, &score);
        const char *id = str_bytes(j->id, &idlen);
        j->row_name = derived_key(s, base, baselen, "job:", id, idlen);
        RedisModule_ZsetRangeNext(s->active);
    }
    RedisModule_ZsetRangeStop(s->active);
}

/* Read every row the sweep will write and decide its fate.  Returns NULL or
 * the error to answer; nothing has been written either way. */
static const char *sweep_decide(Sweep *s, const char *base, size_t baselen,
                                long long max_stalled) {
    for (size_t i = 0; i < s->count; i++)
        if (!emq_acl_may_touch(s->user, s->jobs[i].row_name)) return EMQ_NOPERM_DERIVED;

    long long deaths = 0;
    for (size_t i = 0; i < s->count; i++) {
        SweptJob *j = &s->jobs[i];
        j->row = RedisModule_OpenKey(s->ctx, j->row_name, REDISMODULE_READ | REDISMODULE_WRITE);
        if (!emq_type_ok(j->row, REDISMODULE_KEYTYPE_HASH)) return REDISMODULE_ERRORMSG_WRONGTYPE;

        /* A row that vanished while its id stayed active is re-created by the
         * stall count, as HINCRBY would: the id is not silently dropped. */
        RedisModuleString *cur = NULL;
        if (RedisModule_KeyType(j->row) == REDISMODULE_KEYTYPE_HASH)
            RedisModule_HashGet(j->row, REDISMODULE_HASH_NONE, str_stalled, &cur, NULL);
        size_t curlen = 0;
        const char *curp = cur ? str_bytes(cur, &curlen) : NULL;
        const char *err = emq_next_stalled(curp, curlen, cur != NULL, &j->stalled);
        if (cur) RedisModule_FreeString(s->ctx, cur);
        if (err) return err;
        j->dead = emq_stall_is_dead(j->stalled, max_stalled);
        deaths += j->dead;
    }
    if (deaths == 0) return NULL;

    s->metrics_name = derived_key(s, base, baselen, "metrics:failed", NULL, 0);
    if (!emq_acl_may_touch(s->user, s->metrics_name)) return EMQ_NOPERM_DERIVED;
    s->metrics = RedisModule_OpenKey(s->ctx, s->metrics_name, REDISMODULE_READ | REDISMODULE_WRITE);
    if (!emq_type_ok(s->metrics, REDISMODULE_KEYTYPE_HASH)) return REDISMODULE_ERRORMSG_WRONGTYPE;
    RedisModuleString *cur = NULL;
    if (RedisModule_KeyType(s->metrics) == REDISMODULE_KEYTYPE_HASH)
        RedisModule_HashGet(s->metrics, REDISMODULE_HASH_NONE, str_count, &cur, NULL);
    size_t curlen = 0;
    const char *curp = cur ? str_bytes(cur, &curlen) : NULL;
    long long failed_after;
    const char *err = emq_add_failed(curp, curlen, cur != NULL, deaths, &failed_after);
    if (cur) RedisModule_FreeString(s->ctx, cur);
    s->failed_before = failed_after - deaths;
    return err;
}

/* Apply the decisions, job by job, in the order of the seed's Lua, each
 * write followed by the keyspace event its core command would fire (the
 * low-level key API fires none), so notification consumers see what they
 * saw with the Lua.  Then propagate the result as plain core commands
 * carrying absolute values, so replicas and the AOF hold exactly this.
 *
 * Per job this is the floor's work and little else: field names and values
 * are the shared strings (a stall count below EMQ_SMALL_INTS too), passed as
 * RedisModuleStrings, so the allocations left are the ones the data
 * structures and the propagation itself make. */
static void sweep_apply(Sweep *s, RedisModuleString **argv) {
    RedisModuleCtx *ctx = s->ctx;
    RedisModuleString *active_name = argv[1], *pending_name = argv[2], *dead_name = argv[3];
    long long failed = s->failed_before;

    for (size_t i = 0; i < s->count; i++) {
        SweptJob *j = &s->jobs[i];
        emq_zrem(ctx, s->active, active_name, j->id);

        int small = j->stalled >= 0 && j->stalled < EMQ_SMALL_INTS;
        RedisModuleString *st = small ? small_ints[j->stalled] : emq_ll_string(ctx, j->stalled);
        RedisModule_HashSet(j->row, REDISMODULE_HASH_NONE, str_stalled, st, NULL);
        RedisModule_NotifyKeyspaceEvent(ctx, REDISMODULE_NOTIFY_HASH, "hincrby", j->row_name);
        if (j->dead) {
            RedisModule_HashSet(j->row, REDISMODULE_HASH_NONE, str_state, str_dead, NULL);
            emq_notify_hset(ctx, j->row_name);
            RedisModule_HashSet(j->row, REDISMODULE_HASH_NONE, str_last_error, str_stalled, NULL);
            emq_notify_hset(ctx, j->row_name);
            emq_zadd(ctx, s->dead, dead_name, 0, j->id);
            RedisModuleString *count = emq_ll_string(ctx, ++failed);
            RedisModule_HashSet(s->metrics, REDISMODULE_HASH_NONE, str_count, count, NULL);
            RedisModule_FreeString(ctx, count);
            RedisModule_NotifyKeyspaceEvent(ctx, REDISMODULE_NOTIFY_HASH, "hincrby", s->metrics_name);
            RedisModule_Replicate(ctx, "HSET", "sssssss", j->row_name, str_stalled, st, str_state,
                                  str_dead, str_last_error, str_stalled);
        } else {
            emq_zadd(ctx, s->pending, pending_name, 0, j->id);
            RedisModule_HashSet(j->row, REDISMODULE_HASH_NONE, str_state, str_pending, NULL);
            emq_notify_hset(ctx, j->row_name);
            RedisModule_Replicate(ctx, "HSET", "sssss", j->row_name, str_stalled, st, str_state,
                                  str_pending);
        }
        if (!small) RedisModule_FreeString(ctx, st);
    }
    if (failed != s->failed_before) {
        RedisModuleString *count = emq_ll_string(ctx, failed);
        RedisModule_Replicate(ctx, "HSET", "sss", s->metrics_name, str_count, count);
        RedisModule_FreeString(ctx, count);
    }

    /* One ZREM and one ZADD per set, whatever the number of jobs. */
    RedisModuleString **args = RedisModule_Alloc((2 * s->count + 2) * sizeof *args);
    for (size_t i = 0; i < s->count; i++) args[i] = s->jobs[i].id;
    RedisModule_Replicate(ctx, "ZREM", "sv", active_name, args, s->count);
    for (int to_dead = 0; to_dead <= 1; to_dead++) {
        size_t n = 0;
        for (size_t i = 0; i < s->count; i++) {
            if (s->jobs[i].dead != to_dead) continue;
            args[n++] = small_ints[0];
            args[n++] = s->jobs[i].id;
        }
        if (n) RedisModule_Replicate(ctx, "ZADD", "sv", to_dead ? dead_name : pending_name, args, n);
    }
    RedisModule_Free(args);
}

static void reply_ids(Sweep *s, int dead) {
    long n = 0;
    for (size_t i = 0; i < s->count; i++) n += s->jobs[i].dead == dead;
    RedisModule_ReplyWithArray(s->ctx, n);
    for (size_t i = 0; i < s->count; i++)
        if (s->jobs[i].dead == dead) RedisModule_ReplyWithString(s->ctx, s->jobs[i].id);
}

static int EmqSweep_RedisCommand(RedisModuleCtx *ctx, RedisModuleString **argv, int argc) {
    if (argc != 7) return RedisModule_WrongArity(ctx);

    static const char *const suffix[] = {"active", "pending", "dead"};
    const char *err = emq_check_queue_keys(&argv[1], suffix, 3, argv[4], EMQ_ERR_THREE_SETS);
    long long max_stalled = 0, limit = 0;
    size_t baselen, max_len, limit_len;
    const char *base = str_bytes(argv[4], &baselen);
    const char *max_arg = str_bytes(argv[5], &max_len), *limit_arg = str_bytes(argv[6], &limit_len);
    if (!err) err = emq_parse_count("max-stalled", max_arg, max_len, &max_stalled);
    if (!err) err = emq_parse_count("limit", limit_arg, limit_len, &limit);
    if (!err) err = emq_check_cluster_base(ctx, argv[4]);
    if (err) return RedisModule_ReplyWithError(ctx, err);

    long long now = RedisModule_Milliseconds();
    Sweep s = {.ctx = ctx};
    const int rw = REDISMODULE_READ | REDISMODULE_WRITE;
    s.active = RedisModule_OpenKey(ctx, argv[1], rw);
    s.pending = RedisModule_OpenKey(ctx, argv[2], rw);
    s.dead = RedisModule_OpenKey(ctx, argv[3], rw);
    int reply;
    if (!emq_type_ok(s.active, REDISMODULE_KEYTYPE_ZSET) ||
        !emq_type_ok(s.pending, REDISMODULE_KEYTYPE_ZSET) ||
        !emq_type_ok(s.dead, REDISMODULE_KEYTYPE_ZSET)) {
        reply = RedisModule_ReplyWithError(ctx, REDISMODULE_ERRORMSG_WRONGTYPE);
        goto done;
    }

    sweep_collect(&s, base, baselen, now, limit);
    err = emq_acl_user(ctx, &s.user) ? sweep_decide(&s, base, baselen, max_stalled)
                                      : EMQ_NOPERM_DERIVED;
    if (err) {
        reply = RedisModule_ReplyWithError(ctx, err);
        goto done;
    }
    if (s.count) sweep_apply(&s, argv);

    RedisModule_ReplyWithArray(ctx, 2);
    reply_ids(&s, 0);
    reply_ids(&s, 1);
    reply = REDISMODULE_OK;

done:
    sweep_release(&s);
    return reply;
}

/* ------------------------------------------------------------------------ */

/* What each optional API function is for, so that a server older than the
 * API says in its log exactly what falls back (the module still loads). */
static const char *fallback_of(const char *fn) {
    if (strcmp(fn, "IsModuleNameBusy") == 0)
        return "a second module named 'emq' is not detected at load time";
    return "EMQ.SWEEP, ENQUEUE, CLAIM, FAIL and CANCEL cannot check the job rows and the "
           "metric they derive from <base> against the caller's ACL key permissions (the "
           "declared keys are still checked by the server)";
}

static void log_fallbacks(RedisModuleCtx *ctx) {
    const char *const *missing = emq_rm_missing_optional();
    for (size_t i = 0; missing[i]; i++)
        RedisModule_Log(ctx, "warning", "this server has no RedisModule_%s; falling back: %s",
                        missing[i], fallback_of(missing[i]));
    if (missing[0] == NULL)
        RedisModule_Log(ctx, "notice", "loaded; every optional module API function was found");
}

EMQ_EXPORT int RedisModule_OnLoad(RedisModuleCtx *ctx, RedisModuleString **argv, int argc) {
    (void)argv;
    (void)argc;
    if (emq_rm_init(ctx, "emq", EMQ_MODULE_VERSION) != REDISMODULE_OK) return REDISMODULE_ERR;
    create_shared_strings();

    /* EXTEND only re-scores a member that already exists: O(log N) and it
     * never grows memory, so it stays allowed past maxmemory and live
     * handlers keep their leases.  SWEEP moves up to <limit> jobs and writes
     * rows: not fast, and refused when memory is full. */
    if (RedisModule_CreateCommand(ctx, "emq.extend", EmqExtend_RedisCommand, "write fast", 1, 2,
                                  1) != REDISMODULE_OK)
        return REDISMODULE_ERR;
    if (RedisModule_CreateCommand(ctx, "emq.checkpoint", EmqCheckpoint_RedisCommand, "write fast",
                                  1, 2, 1) != REDISMODULE_OK)
        return REDISMODULE_ERR;
    if (RedisModule_CreateCommand(ctx, "emq.sweep", EmqSweep_RedisCommand, "write deny-oom", 1,
                                  3, 1) != REDISMODULE_OK)
        return REDISMODULE_ERR;
    if (emq_register_lifecycle(ctx) != REDISMODULE_OK) return REDISMODULE_ERR;
    if (emq_register_cancel(ctx) != REDISMODULE_OK) return REDISMODULE_ERR;

    log_fallbacks(ctx);
    return REDISMODULE_OK;
}

EMQ_EXPORT int RedisModule_OnUnload(RedisModuleCtx *ctx) {
    (void)ctx;
    free_shared_strings();
    return REDISMODULE_OK;
}
