/* emq_grouplimit.c -- one group's cap and pause: EMQ.GROUPLIMIT (issue 45).
 *
 * A group's `max` (in <base>group:<g>) caps how many of its jobs are
 * active at once, across all workers; `paused` holds all of them back
 * while the ones running go on.  Neither costs a claim anything: a group
 * is in the ring of groups a claim rotates through exactly when
 * emq_group_claimable says so (emq_group.h), and this verb puts the group
 * in or takes it out as its new setting says. */
#include <string.h>

#include "emq.h"

static const char *const PENDING_ONLY[] = {"pending"};

typedef struct {
    RedisModuleString *group;
    int max_set, nomax, pause, resume;
    long long max;
} GroupLimitArgs;

/* The group, then options in any order, each once: MAX <n> or NOMAX,
 * PAUSE or RESUME. */
static int parse_grouplimit(RedisModuleString **argv, int argc, GroupLimitArgs *a) {
    memset(a, 0, sizeof *a);
    size_t glen;
    const char *g = RedisModule_StringPtrLen(argv[3], &glen);
    int err = emq_parse_group(g, glen);
    if (err) return err;
    a->group = argv[3];
    for (int i = 4; i < argc; i++) {
        size_t len, vlen = 0;
        const char *opt = RedisModule_StringPtrLen(argv[i], &len);
        if (emq_option_is(opt, len, "NOMAX") && !a->nomax && !a->max_set) {
            a->nomax = 1;
            continue;
        }
        if (emq_option_is(opt, len, "PAUSE") && !a->pause && !a->resume) {
            a->pause = 1;
            continue;
        }
        if (emq_option_is(opt, len, "RESUME") && !a->pause && !a->resume) {
            a->resume = 1;
            continue;
        }
        if (i + 1 >= argc) return EMQ_ERR_SYNTAX;
        const char *v = RedisModule_StringPtrLen(argv[i + 1], &vlen);
        if (!emq_option_is(opt, len, "MAX") || a->max_set || a->nomax) return EMQ_ERR_SYNTAX;
        a->max_set = 1;
        err = emq_parse_group_max(v, vlen, &a->max);
        if (err) return err;
        i++;
    }
    return EMQ_OK;
}

/* The ring without `group` (DEL, then RPUSH of what stays), or no ring at
 * all when no other group is left in it (<base>meta's `ring` goes too). */
static void ring_leave(RedisModuleCtx *ctx, EmqFx *fx, RedisModuleString *base, RedisModuleString *group) {
    RedisModuleString *rname = emq_derived_key(ctx, base, "groups", NULL);
    EmqKey ring;
    emq_key_open(ctx, &ring, rname, REDISMODULE_READ | REDISMODULE_WRITE);
    RedisModuleCallReply *r = RedisModule_Call(ctx, "LRANGE", "sll", rname, 0LL, -1LL);
    size_t n = r && RedisModule_CallReplyType(r) == REDISMODULE_REPLY_ARRAY ? RedisModule_CallReplyLength(r) : 0;
    RedisModuleString **stay = RedisModule_Alloc((n ? n : 1) * sizeof *stay);
    long kept = 0, groups = 0;
    for (size_t i = 0; i < n; i++) {
        RedisModuleString *m = RedisModule_CreateStringFromCallReply(RedisModule_CallReplyArrayElement(r, i));
        if (emq_str_equal(m, group)) {
            RedisModule_FreeString(NULL, m);
            continue;
        }
        size_t len;
        RedisModule_StringPtrLen(m, &len);
        groups += len > 0;
        stay[kept++] = m;
    }
    if (r) RedisModule_FreeCallReply(r);
    emq_fx_del(fx, &ring);
    if (groups > 0) emq_fx_push(fx, &ring, 0, stay, kept);
    for (long i = 0; i < kept; i++) RedisModule_FreeString(NULL, stay[i]);
    RedisModule_Free(stay);
    emq_key_close(&ring);
    RedisModule_FreeString(ctx, rname);
    if (groups == 0) {
        RedisModuleString *mname = emq_derived_key(ctx, base, "meta", NULL);
        EmqKey meta;
        emq_key_open(ctx, &meta, mname, REDISMODULE_READ | REDISMODULE_WRITE);
        if (emq_type_ok(&meta, REDISMODULE_KEYTYPE_HASH)) emq_fx_hdel(fx, &meta, emq_str.ring);
        emq_key_close(&meta);
        RedisModule_FreeString(ctx, mname);
    }
}

/* ------------------------------------------------------------------------
 * EMQ.GROUPLIMIT <pending> <base> <group> [MAX <n> | NOMAX] [PAUSE | RESUME]
 *
 * MAX <n> (1 to 1,000,000,000) caps the group: never more than <n> of its
 * jobs active at once; NOMAX removes the cap.  PAUSE holds the group's
 * waiting jobs back (they stay waiting, counted and listed; its active
 * ones run on); RESUME lets them be claimed again.  A group that may be
 * claimed now enters the ring (the claims waiting on the queue look
 * again); one capped at or below its active count, or paused, leaves it.
 * No option: a read.  Reply: [max (null: none), active, waiting
 * (the due jobs in its lane), paused (0 or 1)], as the call leaves them.
 * ------------------------------------------------------------------------ */
int EmqGroupLimit_RedisCommand(RedisModuleCtx *ctx, RedisModuleString **argv, int argc) {
    /* parse */
    if (argc < 4) return RedisModule_WrongArity(ctx);
    GroupLimitArgs a;
    int err = parse_grouplimit(argv, argc, &a);
    if (!err) err = emq_check_queue(ctx, &argv[1], PENDING_ONLY, 1, argv[2], EMQ_ERR_PENDING_KEY);
    if (err) return emq_reply_error(ctx, err);
    RedisModuleString *base = argv[2];
    int writes = a.max_set || a.nomax || a.pause || a.resume;

    /* open, type-check and read: the group's hash, then its lane, the ring and <base>meta */
    RedisModuleUser *user = NULL;
    EmqFx fx;
    emq_fx_begin(&fx, ctx);
    RedisModuleString *hname = emq_derived_key(ctx, base, "group:", a.group);
    RedisModuleString *lname = emq_derived_key(ctx, base, "g:", a.group);
    EmqKey h = {0}, lane = {0};
    long long active = 0, cap = EMQ_NO_CAP, waiting = 0;
    int paused = 0, in_ring = 0;
    if (!emq_acl_user(ctx, &user)) err = EMQ_ERR_NOPERM_DERIVED;
    if (!err) err = emq_open_derived(ctx, user, &h, hname, writes ? EMQ_DERIVED_READ_WRITE : EMQ_DERIVED_READ);
    if (!err && !emq_type_ok(&h, REDISMODULE_KEYTYPE_HASH)) err = EMQ_ERR_WRONGTYPE;
    if (!err) {
        RedisModuleString *v = emq_hget(&h, emq_str.active);
        size_t len = 0;
        const char *p = v ? RedisModule_StringPtrLen(v, &len) : NULL;
        err = emq_parse_group_active(p, len, v != NULL, &active);
        if (v) RedisModule_FreeString(NULL, v);
    }
    if (!err) err = emq_group_caps_read(&h, &active, &cap) ? EMQ_ERR_GROUP_MAX_FIELD : EMQ_OK;
    if (!err) {
        paused = emq_hexists(&h, emq_str.paused);
        in_ring = emq_hexists(&h, emq_str.ring);
        err = emq_open_derived(ctx, user, &lane, lname, EMQ_DERIVED_READ);
    }
    if (!err && !emq_type_ok(&lane, REDISMODULE_KEYTYPE_ZSET)) err = EMQ_ERR_WRONGTYPE;
    if (!err && !emq_key_empty(&lane)) waiting = (long long)RedisModule_ValueLength(lane.key);
    emq_key_close(&lane);
    if (!err && writes) err = emq_group_settle_check(ctx, user, base, a.group);
    if (err) goto reply;

    /* decide and apply: the settings, then the ring */
    int existed = !emq_key_empty(&h);
    long long next_cap = a.max_set ? a.max : a.nomax ? EMQ_NO_CAP : cap;
    int next_paused = a.pause ? 1 : a.resume ? 0 : paused;
    if (next_cap != cap) {
        if (a.max_set) emq_fx_hset(&fx, &h, "hset", 1, emq_str.max, emq_fx_number(&fx, next_cap));
        else emq_fx_hdel(&fx, &h, emq_str.max);
    }
    if (next_paused != paused) {
        if (next_paused) emq_fx_hset(&fx, &h, "hset", 1, emq_str.paused, emq_fx_number(&fx, 1));
        else emq_fx_hdel(&fx, &h, emq_str.paused);
    }
    cap = next_cap;
    paused = next_paused;
    int claimable = emq_group_claimable(waiting > 0, paused, active, cap);
    int leaves = in_ring && !emq_group_claimable(1, paused, active, cap);
    if (leaves) emq_fx_hdel(&fx, &h, emq_str.ring);
    emq_group_index_sync(ctx, &fx, base, a.group, existed, &h);
    emq_key_close(&h);
    if (leaves) ring_leave(ctx, &fx, base, a.group);
    else if (!in_ring && claimable) emq_group_settle(ctx, &fx, base, a.group, NULL);

reply:
    if (err) {
        emq_reply_error(ctx, err);
    } else {
        RedisModule_ReplyWithArray(ctx, 4);
        if (cap == EMQ_NO_CAP) RedisModule_ReplyWithNull(ctx);
        else RedisModule_ReplyWithLongLong(ctx, cap);
        RedisModule_ReplyWithLongLong(ctx, active);
        RedisModule_ReplyWithLongLong(ctx, waiting);
        RedisModule_ReplyWithLongLong(ctx, paused);
    }
    emq_fx_commit(&fx);
    emq_key_close(&h);
    RedisModule_FreeString(ctx, hname);
    RedisModule_FreeString(ctx, lname);
    if (user) RedisModule_FreeModuleUser(user);
    return REDISMODULE_OK;
}
