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

/* The most groups `*` re-evaluates in one call (their hashes, lanes and
 * the ring, O(G)); past it the call is refused and changes nothing. */
#define GROUP_WALK_MAX 10000

typedef struct {
    RedisModuleString *group; /* NULL: `*`, the queue's default for every group without its own cap */
    int max_set, nomax, pause, resume;
    long long max;
} GroupLimitArgs;

/* The group, then options in any order, each once: MAX <n> or NOMAX,
 * PAUSE or RESUME. */
static int parse_grouplimit(RedisModuleString **argv, int argc, GroupLimitArgs *a) {
    memset(a, 0, sizeof *a);
    size_t glen;
    const char *g = RedisModule_StringPtrLen(argv[3], &glen);
    int all = glen == 1 && g[0] == '*';
    int err = all ? EMQ_OK : emq_parse_group(g, glen);
    if (err) return err;
    a->group = all ? NULL : argv[3];
    for (int i = 4; i < argc; i++) {
        size_t len, vlen = 0;
        const char *opt = RedisModule_StringPtrLen(argv[i], &len);
        if (emq_option_is(opt, len, "NOMAX") && !a->nomax && !a->max_set) {
            a->nomax = 1;
            continue;
        }
        if (emq_option_is(opt, len, "PAUSE") && !a->pause && !a->resume && a->group) {
            a->pause = 1;
            continue;
        }
        if (emq_option_is(opt, len, "RESUME") && !a->pause && !a->resume && a->group) {
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
static void ring_leave_all(RedisModuleCtx *ctx, EmqFx *fx, RedisModuleString *base, RedisModuleDict *gone) {
    RedisModuleString *rname = emq_derived_key(ctx, base, "groups", NULL);
    EmqKey ring;
    emq_key_open(ctx, &ring, rname, REDISMODULE_READ | REDISMODULE_WRITE);
    RedisModuleCallReply *r = RedisModule_Call(ctx, "LRANGE", "sll", rname, 0LL, -1LL);
    size_t n = r && RedisModule_CallReplyType(r) == REDISMODULE_REPLY_ARRAY ? RedisModule_CallReplyLength(r) : 0;
    RedisModuleString **stay = RedisModule_Alloc((n ? n : 1) * sizeof *stay);
    long kept = 0, groups = 0;
    for (size_t i = 0; i < n; i++) {
        RedisModuleString *m = RedisModule_CreateStringFromCallReply(RedisModule_CallReplyArrayElement(r, i));
        size_t mlen;
        const char *mp = RedisModule_StringPtrLen(m, &mlen);
        if (RedisModule_DictGetC(gone, (void *)mp, mlen, NULL) != NULL) {
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

static void ring_leave(RedisModuleCtx *ctx, EmqFx *fx, RedisModuleString *base, RedisModuleString *group) {
    RedisModuleDict *gone = RedisModule_CreateDict(NULL);
    size_t glen;
    const char *gp = RedisModule_StringPtrLen(group, &glen);
    RedisModule_DictSetC(gone, (void *)gp, glen, (void *)1);
    ring_leave_all(ctx, fx, base, gone);
    RedisModule_FreeDict(NULL, gone);
}

/* The names in <base>groupset (a ZRANGE reply the caller frees), or NULL. */
static RedisModuleCallReply *group_names(RedisModuleCtx *ctx, RedisModuleString *base, size_t *n) {
    RedisModuleString *iname = emq_derived_key(ctx, base, "groupset", NULL);
    RedisModuleCallReply *r = RedisModule_Call(ctx, "ZRANGE", "sll", iname, 0LL, -1LL);
    RedisModule_FreeString(ctx, iname);
    *n = r && RedisModule_CallReplyType(r) == REDISMODULE_REPLY_ARRAY ? RedisModule_CallReplyLength(r) : 0;
    return r;
}

/* EMQ.GROUPLIMIT <pending> <base> * [MAX <n> | NOMAX]: the queue's default
 * cap, <base>meta's `group_max`, for every group without its own `max`.
 * A change re-evaluates the ring membership of every group it governs
 * (at most GROUP_WALK_MAX of them: more is refused, nothing written).
 * Reply: [group_max (null: none), groups in <base>groupset]. */
static int default_limit(RedisModuleCtx *ctx, RedisModuleString *base, GroupLimitArgs *a) {
    int writes = a->max_set || a->nomax;
    RedisModuleUser *user = NULL;
    EmqFx fx;
    emq_fx_begin(&fx, ctx);
    RedisModuleString *mname = emq_derived_key(ctx, base, "meta", NULL);
    EmqKey meta = {0};
    long long cap = EMQ_NO_CAP, groups = 0;
    int err = emq_acl_user(ctx, &user) ? EMQ_OK : EMQ_ERR_NOPERM_DERIVED;
    if (!err) err = emq_open_derived(ctx, user, &meta, mname, writes ? EMQ_DERIVED_READ_WRITE : EMQ_DERIVED_READ);
    if (!err && !emq_type_ok(&meta, REDISMODULE_KEYTYPE_HASH)) err = EMQ_ERR_WRONGTYPE;
    if (!err) err = emq_group_index_check(ctx, user, base);
    if (!err) err = emq_group_default_cap(ctx, base, &cap);
    size_t n = 0;
    RedisModuleCallReply *names = err ? NULL : group_names(ctx, base, &n);
    groups = (long long)n;
    long long next = a->max_set ? a->max : a->nomax ? EMQ_NO_CAP : cap;
    int changes = !err && next != cap;
    if (changes && n > GROUP_WALK_MAX) err = EMQ_ERR_GROUP_WALK;
    for (size_t i = 0; changes && !err && i < n; i++) {
        RedisModuleString *g = RedisModule_CreateStringFromCallReply(RedisModule_CallReplyArrayElement(names, i));
        err = emq_group_settle_check(ctx, user, base, g);
        RedisModuleString *hname = emq_derived_key(ctx, base, "group:", g);
        EmqKey h = {0};
        if (!err) err = emq_open_derived(ctx, user, &h, hname, EMQ_DERIVED_READ_WRITE);
        if (!err && !emq_type_ok(&h, REDISMODULE_KEYTYPE_HASH)) err = EMQ_ERR_WRONGTYPE;
        long long active, own;
        if (!err) err = emq_group_caps_read(ctx, base, &h, &active, &own);
        emq_key_close(&h);
        RedisModule_FreeString(ctx, hname);
        RedisModule_FreeString(NULL, g);
    }
    if (!err && changes) {
        if (a->max_set) emq_fx_hset(&fx, &meta, "hset", 1, emq_str.group_max, emq_fx_number(&fx, next));
        else emq_fx_hdel(&fx, &meta, emq_str.group_max);
        RedisModuleDict *gone = RedisModule_CreateDict(NULL);
        size_t leaving = 0;
        for (size_t i = 0; i < n; i++) {
            RedisModuleString *g = RedisModule_CreateStringFromCallReply(RedisModule_CallReplyArrayElement(names, i));
            RedisModuleString *hname = emq_derived_key(ctx, base, "group:", g);
            EmqKey h;
            emq_key_open(ctx, &h, hname, REDISMODULE_READ | REDISMODULE_WRITE);
            long long active = 0, in_force = EMQ_NO_CAP;
            emq_group_caps_read(ctx, base, &h, &active, &in_force); /* checked above; the new default read */
            int in_ring = emq_hexists(&h, emq_str.ring);
            int paused = emq_hexists(&h, emq_str.paused);
            if (in_ring && !emq_group_claimable(1, paused, active, in_force)) {
                emq_fx_hdel(&fx, &h, emq_str.ring);
                size_t glen;
                const char *gp = RedisModule_StringPtrLen(g, &glen);
                RedisModule_DictSetC(gone, (void *)gp, glen, (void *)1);
                leaving++;
            }
            emq_key_close(&h);
            RedisModule_FreeString(ctx, hname);
            if (!in_ring) emq_group_settle(ctx, &fx, base, g, NULL);
            RedisModule_FreeString(NULL, g);
        }
        if (leaving) ring_leave_all(ctx, &fx, base, gone);
        RedisModule_FreeDict(NULL, gone);
        cap = next;
    }
    if (names) RedisModule_FreeCallReply(names);
    if (err) {
        emq_reply_error(ctx, err);
    } else {
        RedisModule_ReplyWithArray(ctx, 2);
        if (cap == EMQ_NO_CAP) RedisModule_ReplyWithNull(ctx);
        else RedisModule_ReplyWithLongLong(ctx, cap);
        RedisModule_ReplyWithLongLong(ctx, groups);
    }
    emq_fx_commit(&fx);
    emq_key_close(&meta);
    RedisModule_FreeString(ctx, mname);
    if (user) RedisModule_FreeModuleUser(user);
    return REDISMODULE_OK;
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
    if (a.group == NULL) return default_limit(ctx, base, &a);
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
    if (!err) err = emq_group_caps_read(ctx, base, &h, &active, &cap); /* the cap in force */
    long long own = EMQ_NO_CAP, fallback = EMQ_NO_CAP; /* its own `max`; the queue's default */
    if (!err) {
        RedisModuleString *v = emq_hget(&h, emq_str.max);
        if (v == NULL) fallback = cap;
        else own = cap;
        if (v) RedisModule_FreeString(NULL, v);
        if (v != NULL) err = emq_group_default_cap(ctx, base, &fallback);
    }
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
    long long next_cap = a.max_set ? a.max : a.nomax ? EMQ_NO_CAP : own;
    int next_paused = a.pause ? 1 : a.resume ? 0 : paused;
    if (next_cap != own) {
        if (a.max_set) emq_fx_hset(&fx, &h, "hset", 1, emq_str.max, emq_fx_number(&fx, next_cap));
        else emq_fx_hdel(&fx, &h, emq_str.max);
    }
    if (next_paused != paused) {
        if (next_paused) emq_fx_hset(&fx, &h, "hset", 1, emq_str.paused, emq_fx_number(&fx, 1));
        else emq_fx_hdel(&fx, &h, emq_str.paused);
    }
    own = next_cap;
    cap = own != EMQ_NO_CAP ? own : fallback;
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
        if (own == EMQ_NO_CAP) RedisModule_ReplyWithNull(ctx); /* its own cap: null when the default applies */
        else RedisModule_ReplyWithLongLong(ctx, own);
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
