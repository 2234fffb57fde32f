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
#include <string.h>

#include "emq_claim.h"

static const char *const PENDING_ACTIVE[] = {"pending", "active"};

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

Claimed *emq_claim_add_job(Claim *c, long cap, RedisModuleString *id) {
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
        Claimed *j = emq_claim_add_job(c, pairs, RedisModule_CreateString(c->ctx, id, idlen));
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
    if (!err) err = emq_claim_collect(c, now, (long)count);
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
    emq_deps_drain(ctx, argv[3], EMQ_DEPS_STEP); /* a step of the ends not resolved yet (emq_deps.h) */

    /* open, read, decide, apply, reply (a waiting claim woken later asks again: emq_keys.h) */
    int vouched = emq_slot_vouched_begin(ctx, argv + 1, 3);
    int outcome = claim_run(ctx, argv, &a, now, 0, &due);
    emq_slot_vouched_end(vouched);
    if (outcome == CLAIM_ANSWERED) return REDISMODULE_OK;

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
    emq_deps_drain(ctx, base, EMQ_DEPS_STEP); /* a step of the ends not resolved yet (emq_deps.h) */

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
        /* The complete's "left active" hook settles the group of the job
         * it ends (a slot freed puts a group held at its cap back in the
         * ring) after the claim's writes: as the claim left the ring. */
        done.end.groups.defer_settle = 1;
        emq_complete_apply(&fx, &done, id, now);
        if (!c.reanswered) apply(&c, &fx, now, a.deadline);
        emq_groups_settle_deferred(&done.end.groups, &fx);
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
