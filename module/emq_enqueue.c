/* emq_enqueue.c -- jobs enter the queue: EMQ.ENQUEUE and EMQ.ENQUEUEMANY.
 *
 * ENQUEUE writes the job's row -- only what a waiting job needs: state,
 * payload (in pieces, emq_row.h), enqueued_at, and priority when it is not
 * 0 -- and puts its id at the tail of its lane (emq_lanes.h): <pending>
 * for priority 0, <base>priority for any other; or, with a DELAY or an AT
 * in the future, in <base>delayed until it is due.  Claims take the lanes
 * in priority order, first in, first out within a level.  An id names one
 * job for its whole life: re-enqueueing a live id would reset the fencing
 * state of whoever holds it.  ENQUEUEMANY does the same for many jobs in
 * one call, all or none. */
#include <string.h>

#include "emq.h"
#include "emq_config.h"

static const char *const PENDING[] = {"pending"};

/* [DELAY <ms> | AT <unix-ms>] [PRIORITY <n>] [GROUP <g>] [REQ <request-id>],
 * from argv[from]: the request id (or NULL), the due time (now when neither
 * DELAY nor AT), the level (0 without PRIORITY) and the group (or NULL); and ENQUEUE's UNIQUE
 * options into *u (emq_unique.h; NULL for ENQUEUEMANY, which refuses
 * UNIQUE). */
static int parse_options(RedisModuleString **argv, int from, int argc, long long now, RedisModuleString **req,
                         long long *due, long long *level, RedisModuleString **group, EmqUniqueOpts *u,
                         EmqDepsOpts *d, int *delayed) {
    int seen_when = 0, seen_priority = 0;
    *req = NULL;
    *group = NULL;
    *due = now;
    *level = 0;
    if (u) memset(u, 0, sizeof *u);
    if (d) memset(d, 0, sizeof *d);
    for (int i = from; i < argc; i += 2) {
        int uerr, took = emq_unique_option(u, argv, i, argc, &uerr);
        if (!uerr && !took) took = emq_deps_option(d, argv, i, argc, &uerr);
        if (uerr) return uerr;
        if (took) { /* REPLACE takes one argument, AFTER the rest, the loop steps two */
            i += took - 2;
            continue;
        }
        size_t len, vlen;
        const char *opt = RedisModule_StringPtrLen(argv[i], &len);
        if (i + 1 >= argc) return EMQ_ERR_SYNTAX;
        const char *val = RedisModule_StringPtrLen(argv[i + 1], &vlen);
        int delay = emq_option_is(opt, len, "DELAY"), at = emq_option_is(opt, len, "AT");
        if (emq_option_is(opt, len, "REQ") && !*req) {
            if (vlen == 0) return EMQ_ERR_REQ_EMPTY;
            *req = argv[i + 1];
        } else if (emq_option_is(opt, len, "PRIORITY") && !seen_priority) {
            seen_priority = 1;
            int err = emq_parse_priority(val, vlen, level);
            if (err) return err;
        } else if (emq_option_is(opt, len, "GROUP") && !*group) {
            int err = emq_parse_group(val, vlen);
            if (err) return err;
            *group = argv[i + 1];
        } else if (delay || at) {
            if (seen_when) return seen_when == (delay ? 1 : 2) ? EMQ_ERR_SYNTAX : EMQ_ERR_DELAY_AND_AT;
            seen_when = delay ? 1 : 2;
            *delayed = 1;
            int err = delay ? emq_due_after_delay(now, val, vlen, due) : emq_due_at(now, val, vlen, due);
            if (err) return err;
        } else {
            return EMQ_ERR_SYNTAX;
        }
    }
    return u ? emq_unique_options_check(u) : EMQ_OK;
}

/* The options, and AFTER's checks against the job's id. */
static int parse_all(RedisModuleString **argv, int from, int argc, long long now, RedisModuleString **req,
                     long long *due, long long *level, RedisModuleString **group, EmqUniqueOpts *u, EmqDepsOpts *d,
                     int *delayed, RedisModuleString *id) {
    *delayed = 0;
    int err = parse_options(argv, from, argc, now, req, due, level, group, u, d, delayed);
    return err || d == NULL ? err : emq_deps_options_check(d, id);
}

/* The payload's ceiling (emq.max-payload-bytes). */
static int check_payload(RedisModuleString *payload) {
    size_t len;
    RedisModule_StringPtrLen(payload, &len);
    return (long long)len > emq_config_max_payload_bytes() ? EMQ_ERR_PAYLOAD_TOO_LARGE : EMQ_OK;
}

/* The new row: one HSET, as the core command would be: state, the payload
 * and its pieces, enqueued_at, and the level when it is not 0.  No
 * counters: a row without `attempts` or `tries` has been claimed 0 times. */
static void write_row(EmqFx *fx, EmqKey *row, RedisModuleString *payload, RedisModuleString *at,
                      RedisModuleString *level, RedisModuleString *group, RedisModuleString *unique,
                      RedisModuleString *state, int nextra, RedisModuleString **efields, RedisModuleString **evalues) {
    RedisModuleString *fields[EMQ_MAX_PIECES + 10], *values[EMQ_MAX_PIECES + 10];
    fields[0] = emq_str.state, values[0] = state;
    int n = 1 + emq_row_pieces(fx, EMQ_VALUE_PAYLOAD, payload, fields + 1, values + 1);
    fields[n] = emq_str.enqueued_at, values[n++] = at;
    if (level) fields[n] = emq_str.priority, values[n++] = level;
    if (group) fields[n] = emq_str.group, values[n++] = group;
    if (unique) fields[n] = emq_str.unique, values[n++] = unique;
    for (int k = 0; k < nextra; k++) fields[n] = efields[k], values[n++] = evalues[k];
    emq_fx_hset_argv(fx, row, "hset", n, fields, values);
}

/* The level as the row stores it: nothing for 0. */
static RedisModuleString *level_field(EmqFx *fx, long long level) {
    return level == 0 ? NULL : emq_fx_number(fx, level);
}

/* With REQ: open <base>req:<request-id> (the caller's ACL first).  An
 * enqueue only creates it, as SET NX would, and learns only whether it
 * exists: the caller needs write permission on it, as on the rows (a %W~
 * user may enqueue), and nothing is read from it.  *name is made here (NULL
 * without REQ) and freed by the caller. */
static int open_record(RedisModuleCtx *ctx, RedisModuleUser *user, RedisModuleString *base, RedisModuleString *req,
                       EmqKey *record, RedisModuleString **name) {
    if (req == NULL) return EMQ_OK;
    *name = emq_derived_key(ctx, base, "req:", req);
    return emq_open_derived(ctx, user, record, *name, EMQ_DERIVED_RECORD_CREATE);
}

/* Remember the call for EMQ_ENQUEUE_RECORD_TTL_MS: SET, then PEXPIREAT
 * (absolute, as a replica and the AOF get it). */
static void write_record(RedisModuleCtx *ctx, EmqFx *fx, EmqKey *record, long long count, long long now) {
    char buf[24];
    int n = emq_enqueue_record(count, buf);
    RedisModuleString *value = RedisModule_CreateString(ctx, buf, (size_t)n);
    emq_fx_set(fx, record, value);
    emq_fx_pexpireat(fx, record, now + EMQ_ENQUEUE_RECORD_TTL_MS);
    RedisModule_FreeString(ctx, value);
}

/* ------------------------------------------------------------------------
 * EMQ.ENQUEUE <pending> <base> <id> <payload> [DELAY <ms> | AT <unix-ms>]
 *             [PRIORITY <n>] [GROUP <g>] [REQ <request-id>]
 *
 * :1 the row <base>job:<id> is created (state=pending, payload and its
 * pieces, enqueued_at, priority unless 0, group when given) and <id> waits at the tail of its
 * lane, claimable from server-now -- or in <base>delayed until server-now +
 * DELAY ms, or AT (an AT in the past too, scored with it, so that the claim
 * that moves the due jobs takes them oldest due time first); with REQ, the record
 * <base>req:<request-id> = "1" is kept for 60 s.  -ERR for a payload over
 * emq.max-payload-bytes.
 * -EMQEXISTS when the row exists.  A retry whose first reply was lost (the
 * record exists) answers :1 again and writes nothing -- also when the job
 * has run and its row is gone since.
 * ------------------------------------------------------------------------ */
int EmqEnqueue_RedisCommand(RedisModuleCtx *ctx, RedisModuleString **argv, int argc) {
    /* parse */
    if (argc < 5) return RedisModule_WrongArity(ctx);
    RedisModuleString *id = argv[3], *payload = argv[4], *req, *group;
    long long now = RedisModule_Milliseconds(), due, level;
    EmqUniqueOpts uopts;
    EmqDepsOpts dopts;
    int delayed;
    int err = parse_all(argv, 5, argc, now, &req, &due, &level, &group, &uopts, &dopts, &delayed, id);
    if (!err) err = check_payload(payload);
    if (!err) err = emq_check_queue(ctx, &argv[1], PENDING, 1, argv[2], EMQ_ERR_PENDING_KEY);
    if (err) {
        emq_deps_opts_free(&dopts);
        return emq_reply_error(ctx, err);
    }

    /* open and type-check: the row's and the record's ACL before they are read */
    RedisModuleUser *user = NULL;
    EmqKey pending, row = {0}, record = {0};
    RedisModuleString *record_name = NULL;
    emq_key_open(ctx, &pending, argv[1], REDISMODULE_READ | REDISMODULE_WRITE);
    RedisModuleString *row_name = emq_derived_key(ctx, argv[2], "job:", id);
    EmqFx fx;
    emq_fx_begin(&fx, ctx);
    EmqLanes lanes;
    emq_lanes_init(&lanes, ctx, NULL, argv[2], &pending);
    EmqUnique unique;
    emq_unique_init(&unique, ctx, &uopts);
    EmqRegistry registry;
    emq_registry_init(&registry, ctx);
    EmqDeps deps;
    emq_deps_init(&deps, ctx, &dopts);
    int wrote = 0;
    if (!emq_type_ok(&pending, REDISMODULE_KEYTYPE_LIST)) err = EMQ_ERR_WRONGTYPE;
    else if (!emq_acl_user(ctx, &user)) err = EMQ_ERR_NOPERM_DERIVED;
    else err = emq_open_derived(ctx, user, &row, row_name, EMQ_DERIVED_CREATE);
    if (!err) err = open_record(ctx, user, argv[2], req, &record, &record_name);
    if (!err) err = emq_registry_open(&registry, user, argv[2], &pending);
    if (err) goto reply;

    /* read and decide: a retry of this very call (its record exists: the
     * first call ran, whatever became of the job since), a unique key held
     * by another job (nothing enqueued; with REPLACE, a pending holder's
     * payload replaced), a taken id, or a new job -- and where it waits */
    if (req && !emq_key_empty(&record)) goto reply;
    err = emq_unique_decide(&unique, user, argv[2]);
    if (err) goto reply;
    if (unique.verdict == EMQ_UNIQUE_REPLACE) emq_unique_replace(&unique, &fx, payload);
    if (unique.verdict != EMQ_UNIQUE_TAKE) goto reply;
    if (!emq_key_empty(&row)) {
        err = EMQ_ERR_EXISTS;
        goto reply;
    }
    /* its dependencies: all met, waited for (no lane yet), or one failed
     * under `fail` (it ends dead at once) */
    err = emq_deps_decide(&deps, user, argv[2], id);
    if (err) goto reply;
    lanes.user = user;
    int laned = deps.verdict == EMQ_DEPS_NONE || deps.verdict == EMQ_DEPS_MET;
    if (laned) err = emq_lanes_enter_in(&lanes, id, group, level, due, now);
    if (err) goto reply;

    /* apply */
    RedisModuleString *efields[4], *evalues[4], *state;
    int nextra = emq_deps_row_fields(&deps, &fx, now, due, delayed, efields, evalues, &state);
    write_row(&fx, &row, payload, emq_fx_number(&fx, now), level_field(&fx, level), group,
              deps.verdict == EMQ_DEPS_DIES ? NULL : uopts.key, state, nextra, efields, evalues);
    emq_lanes_apply(&lanes, &fx);
    emq_deps_apply(&deps, &fx, argv[2], id, now);
    if (deps.verdict != EMQ_DEPS_DIES) emq_unique_take(&unique, &fx, id, now);
    emq_registry_mark(&registry, &fx);
    if (req) write_record(ctx, &fx, &record, 1, now);
    wrote = laned;

reply:
    if (err) emq_deps_reply_error(ctx, &deps, err);
    else if (uopts.key) emq_unique_reply(&unique, id);
    else RedisModule_ReplyWithLongLong(ctx, 1);
    emq_fx_commit(&fx);
    emq_deps_close(&deps);
    emq_deps_opts_free(&dopts);
    emq_unique_close(&unique);
    emq_registry_close(&registry);
    emq_lanes_close(&lanes);
    emq_key_close(&record);
    if (record_name) RedisModule_FreeString(ctx, record_name);
    emq_key_close(&row);
    RedisModule_FreeString(ctx, row_name);
    emq_key_close(&pending);
    if (wrote) emq_signal_due(ctx, argv[1], due, now);
    if (user) RedisModule_FreeModuleUser(user);
    /* Every enqueue takes a step of the ends not resolved yet. */
    if (!err) emq_deps_drain(ctx, argv[2], EMQ_DEPS_STEP);
    return REDISMODULE_OK;
}

/* ------------------------------------------------------------------------
 * EMQ.ENQUEUEMANY <pending> <base> <count> <id> <payload> [<id> <payload> ...]
 *                 [DELAY <ms> | AT <unix-ms>] [PRIORITY <n>] [GROUP <g>] [REQ <request-id>]
 *
 * :<count> every job is created as by ENQUEUE (one row each, the same due
 * time and level for all, entering the lane in argument order), or none
 * is: -EMQEXISTS when any of the rows exists.  With
 * REQ, one record <base>req:<request-id> = "<count>" is kept for 60 s: a
 * retry whose first reply was lost answers :<count> again and writes
 * nothing, whatever became of the jobs since.  Two equal ids in one call
 * are refused.  At most emq.max-limit jobs (10,000 by default).
 * Propagated as one HSET per row and one RPUSH (or ZADD) with every id.
 * ------------------------------------------------------------------------ */
typedef struct {
    RedisModuleCtx *ctx;
    long n;
    RedisModuleString **ids, **names;
    EmqKey *rows;
    const char **items;
    size_t *lens;
    long *order;
} Many;

static void many_release(Many *m) {
    for (long i = 0; i < m->n; i++) {
        emq_key_close(&m->rows[i]);
        if (m->names[i]) RedisModule_FreeString(m->ctx, m->names[i]);
    }
    RedisModule_Free(m->rows);
    RedisModule_Free(m->names);
    RedisModule_Free(m->ids);
    RedisModule_Free(m->items);
    RedisModule_Free(m->lens);
    RedisModule_Free(m->order);
}

int EmqEnqueueMany_RedisCommand(RedisModuleCtx *ctx, RedisModuleString **argv, int argc) {
    /* parse: the count against the server's ceiling, then against the
     * arguments, before it sizes anything */
    if (argc < 6) return RedisModule_WrongArity(ctx);
    size_t len;
    const char *count_arg = RedisModule_StringPtrLen(argv[3], &len);
    long long count;
    int err = emq_parse_many_count(count_arg, len, emq_config_max_limit(), &count);
    if (err) return emq_reply_error(ctx, err);
    if (!emq_count_fits(count, 2, 4, argc)) return RedisModule_WrongArity(ctx);
    RedisModuleString *req, *group;
    long long now = RedisModule_Milliseconds(), due, level;
    int delayed;
    err = parse_all(argv, 4 + 2 * (int)count, argc, now, &req, &due, &level, &group, NULL, NULL, &delayed, NULL);
    for (long long i = 0; !err && i < count; i++) err = check_payload(argv[5 + 2 * i]);
    if (!err) err = emq_check_queue(ctx, &argv[1], PENDING, 1, argv[2], EMQ_ERR_PENDING_KEY);
    if (err) return emq_reply_error(ctx, err);
    Many m = {.ctx = ctx, .n = (long)count};
    m.ids = RedisModule_Alloc((size_t)m.n * sizeof *m.ids);
    m.items = RedisModule_Alloc((size_t)m.n * sizeof *m.items);
    m.lens = RedisModule_Alloc((size_t)m.n * sizeof *m.lens);
    m.order = RedisModule_Alloc((size_t)m.n * sizeof *m.order);
    m.names = RedisModule_Alloc((size_t)m.n * sizeof *m.names);
    m.rows = RedisModule_Alloc((size_t)m.n * sizeof *m.rows);
    for (long i = 0; i < m.n; i++) {
        m.ids[i] = argv[4 + 2 * i];
        m.items[i] = RedisModule_StringPtrLen(m.ids[i], &m.lens[i]);
        m.names[i] = NULL;
        memset(&m.rows[i], 0, sizeof m.rows[i]);
    }
    if (emq_first_duplicate(m.items, m.lens, m.n, m.order) >= 0) {
        many_release(&m);
        return emq_reply_error(ctx, EMQ_ERR_MANY_DUPLICATE);
    }

    /* open and type-check: every row's ACL, and the record's, before any is read */
    RedisModuleUser *user = NULL;
    EmqKey pending, record = {0};
    RedisModuleString *record_name = NULL;
    emq_key_open(ctx, &pending, argv[1], REDISMODULE_READ | REDISMODULE_WRITE);
    EmqFx fx;
    emq_fx_begin(&fx, ctx);
    EmqLanes lanes;
    emq_lanes_init(&lanes, ctx, NULL, argv[2], &pending);
    EmqRegistry registry;
    emq_registry_init(&registry, ctx);
    int wrote = 0;
    if (!emq_type_ok(&pending, REDISMODULE_KEYTYPE_LIST)) err = EMQ_ERR_WRONGTYPE;
    else if (!emq_acl_user(ctx, &user)) err = EMQ_ERR_NOPERM_DERIVED;
    for (long i = 0; !err && i < m.n; i++) {
        m.names[i] = emq_derived_key(ctx, argv[2], "job:", m.ids[i]);
        err = emq_open_derived(ctx, user, &m.rows[i], m.names[i], EMQ_DERIVED_CREATE);
    }
    if (!err) err = open_record(ctx, user, argv[2], req, &record, &record_name);
    if (!err) err = emq_registry_open(&registry, user, argv[2], &pending);
    if (err) goto reply;

    /* read and decide: a retry of this very call, all new, or refused; and
     * where they wait */
    if (req && !emq_key_empty(&record)) goto reply;
    for (long i = 0; !err && i < m.n; i++)
        if (!emq_key_empty(&m.rows[i])) err = EMQ_ERR_EXISTS;
    lanes.user = user;
    for (long i = 0; !err && i < m.n; i++) err = emq_lanes_enter_in(&lanes, m.ids[i], group, level, due, now);
    if (err) goto reply;

    /* apply: the rows, then the lane (one RPUSH or ZADD), then the record */
    RedisModuleString *at = emq_fx_number(&fx, now), *lf = level_field(&fx, level);
    for (long i = 0; i < m.n; i++)
        write_row(&fx, &m.rows[i], argv[5 + 2 * i], at, lf, group, NULL, emq_str.pending, 0, NULL, NULL);
    emq_lanes_apply(&lanes, &fx);
    emq_registry_mark(&registry, &fx);
    if (req) write_record(ctx, &fx, &record, count, now);
    wrote = 1;

reply:
    if (err) emq_reply_error(ctx, err);
    else RedisModule_ReplyWithLongLong(ctx, m.n);
    emq_fx_commit(&fx);
    emq_registry_close(&registry);
    emq_lanes_close(&lanes);
    emq_key_close(&record);
    if (record_name) RedisModule_FreeString(ctx, record_name);
    many_release(&m);
    emq_key_close(&pending);
    if (wrote) emq_signal_due(ctx, argv[1], due, now);
    if (user) RedisModule_FreeModuleUser(user);
    return REDISMODULE_OK;
}
