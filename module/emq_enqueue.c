/* emq_enqueue.c -- a job enters the queue: EMQ.ENQUEUE.
 *
 * ENQUEUE writes the job's row and puts its id in <pending>, scored with
 * the time it may be claimed (server-now), so claims take jobs first in,
 * first out.  An id names one job for its whole life: re-enqueueing a live
 * id would reset the fencing state of whoever holds it. */
#include "emq.h"

static const char *const PENDING[] = {"pending"};

/* ------------------------------------------------------------------------
 * EMQ.ENQUEUE <pending> <base> <id> <payload> [REQ <request-id>]
 *
 * :1 the row <base>job:<id> is created (state=pending, attempts=0, tries=0,
 * payload, enqueued_at) and <id> waits in <pending>.  -EMQEXISTS when the
 * row exists -- unless it was created by this very request (same REQ): a
 * retry whose first reply was lost answers :1 again and writes nothing.
 * ------------------------------------------------------------------------ */
int EmqEnqueue_RedisCommand(RedisModuleCtx *ctx, RedisModuleString **argv, int argc) {
    /* parse */
    if (argc < 5) return RedisModule_WrongArity(ctx);
    RedisModuleString *id = argv[3], *payload = argv[4], *req = NULL;
    for (int i = 5; i < argc; i += 2) {
        size_t len;
        const char *opt = RedisModule_StringPtrLen(argv[i], &len);
        if (i + 1 >= argc || req || !emq_option_is(opt, len, "REQ")) return emq_reply_error(ctx, EMQ_ERR_SYNTAX);
        req = argv[i + 1];
        RedisModule_StringPtrLen(req, &len);
        if (len == 0) return emq_reply_error(ctx, EMQ_ERR_REQ_EMPTY);
    }
    int err = emq_check_queue(ctx, &argv[1], PENDING, 1, argv[2], EMQ_ERR_PENDING_KEY);
    if (err) return emq_reply_error(ctx, err);
    long long now = RedisModule_Milliseconds();

    /* open and type-check: the row's ACL before it is read */
    RedisModuleUser *user = NULL;
    EmqKey pending, row = {0};
    emq_key_open(ctx, &pending, argv[1], REDISMODULE_READ | REDISMODULE_WRITE);
    RedisModuleString *row_name = emq_derived_key(ctx, argv[2], "job:", id);
    EmqFx fx;
    emq_fx_begin(&fx, ctx);
    if (!emq_type_ok(&pending, REDISMODULE_KEYTYPE_ZSET)) err = EMQ_ERR_WRONGTYPE;
    else if (!emq_acl_user(ctx, &user)) err = EMQ_ERR_NOPERM_DERIVED;
    else err = emq_open_derived(ctx, user, &row, row_name, EMQ_DERIVED_CREATE);
    if (err) goto reply;

    /* read and decide */
    if (!emq_key_empty(&row)) {
        RedisModuleString *first = req ? emq_hget(&row, emq_str.request) : NULL;
        int same_request = first && emq_str_equal(first, req);
        if (first) RedisModule_FreeString(NULL, first);
        if (!same_request) err = EMQ_ERR_EXISTS;
        goto reply;
    }

    /* apply */
    /* One HSET, as the core command would be; the request id only when given. */
    RedisModuleString *at = emq_fx_number(&fx, now), *zero = emq_small_int[0];
    if (req)
        emq_fx_hset(&fx, &row, "hset", 6, emq_str.state, emq_str.pending, emq_str.attempts, zero,
                    emq_str.tries, zero, emq_str.payload, payload, emq_str.enqueued_at, at,
                    emq_str.request, req);
    else
        emq_fx_hset(&fx, &row, "hset", 5, emq_str.state, emq_str.pending, emq_str.attempts, zero,
                    emq_str.tries, zero, emq_str.payload, payload, emq_str.enqueued_at, at);
    emq_fx_zadd(&fx, &pending, now, id, 0);

reply:
    if (err) emq_reply_error(ctx, err);
    else RedisModule_ReplyWithLongLong(ctx, 1);
    emq_fx_commit(&fx);
    emq_key_close(&row);
    RedisModule_FreeString(ctx, row_name);
    emq_key_close(&pending);
    if (user) RedisModule_FreeModuleUser(user);
    return REDISMODULE_OK;
}
