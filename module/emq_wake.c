/* emq_wake.c -- see emq_wake.h.
 *
 * The registry: one entry per (database, <pending>) that claims wait on,
 * counting them (each blocked claim's private data is its key's entry;
 * the server frees that data, here, once per claim that stops waiting:
 * served, timed out, unblocked, disconnected) and holding the key's due
 * timer.  An entry, and its timer, goes when the last claim stops waiting,
 * so an idle server holds no timer and the module can be unloaded. */
#include <string.h>

#include "emq.h"

/* The longest a due timer sleeps before the waiting claims look again.  A
 * due time is on the server's wall clock and the timer on its own clock: a
 * clock step can make them disagree, and this bounds how late that makes a
 * delayed job (the claims find nothing due and re-arm). */
#define EMQ_WAKE_MAX_SLEEP_MS 10000

/* The keys a waiting claim waits on: its queue's three lanes.  A module's
 * blocked client is served only when a signalled key exists (the server
 * looks the key up first), and a queue's claimable jobs may all be in
 * <base>priority, or all not due yet in <base>delayed, with <pending>
 * absent, or all in group lanes (then <base>groups, the ring, exists): so a
 * claim waits on each, and a verb signals the lane it wrote. */
enum { LANE_PENDING, LANE_PRIORITY, LANE_DELAYED, LANE_RING, LANES };
static const char *const lane_suffix[LANES] = {"pending", "priority", "delayed", "groups"};

typedef struct {
    RedisModuleString *lanes[LANES]; /* the keys' names, for SignalKeyAsReady */
    int dbid;
    long waiters;
    int armed;
    long long due; /* when armed: the server time the timer fires at */
    RedisModuleTimerID timer;
    size_t idlen;
    char id[]; /* the registry key: dbid then the name */
} WaitKey;

static RedisModuleDict *registry;

/* The registry key of (dbid, name) in buf (or a heap buffer when long: the
 * caller frees it when it is not buf). */
static char *registry_key(int dbid, RedisModuleString *name, char *buf, size_t bufsize, size_t *len) {
    size_t namelen;
    const char *n = RedisModule_StringPtrLen(name, &namelen);
    *len = sizeof dbid + namelen;
    char *out = *len <= bufsize ? buf : RedisModule_Alloc(*len);
    memcpy(out, &dbid, sizeof dbid);
    memcpy(out + sizeof dbid, n, namelen);
    return out;
}

static WaitKey *find(int dbid, RedisModuleString *name) {
    if (registry == NULL || RedisModule_DictSize(registry) == 0) return NULL;
    char small[256];
    size_t len;
    char *key = registry_key(dbid, name, small, sizeof small, &len);
    int nokey = 1;
    WaitKey *w = RedisModule_DictGetC(registry, key, len, &nokey);
    if (key != small) RedisModule_Free(key);
    return nokey ? NULL : w;
}

/* The three lanes of the queue whose <pending> is `pending` (new strings). */
static void lanes_of(RedisModuleString *pending, RedisModuleString **lanes) {
    size_t len;
    const char *p = RedisModule_StringPtrLen(pending, &len);
    size_t baselen = len >= 7 ? len - 7 : 0; /* <pending> is <base>pending, checked by every verb */
    for (int i = 0; i < LANES; i++) {
        size_t slen = strlen(lane_suffix[i]);
        char small[256];
        char *buf = baselen + slen <= sizeof small ? small : RedisModule_Alloc(baselen + slen);
        memcpy(buf, p, baselen);
        memcpy(buf + baselen, lane_suffix[i], slen);
        lanes[i] = RedisModule_CreateString(NULL, buf, baselen + slen);
        if (buf != small) RedisModule_Free(buf);
    }
}

static void free_lanes(RedisModuleString **lanes) {
    for (int i = 0; i < LANES; i++) RedisModule_FreeString(NULL, lanes[i]);
}

static WaitKey *find_or_add(int dbid, RedisModuleString *name) {
    WaitKey *w = find(dbid, name);
    if (w) return w;
    if (registry == NULL) registry = RedisModule_CreateDict(NULL);
    char small[256];
    size_t len;
    char *key = registry_key(dbid, name, small, sizeof small, &len);
    w = RedisModule_Alloc(sizeof *w + len);
    memset(w, 0, sizeof *w);
    lanes_of(name, w->lanes);
    w->dbid = dbid;
    w->idlen = len;
    memcpy(w->id, key, len);
    if (key != small) RedisModule_Free(key);
    RedisModule_DictSetC(registry, w->id, w->idlen, w);
    return w;
}

static void on_due(RedisModuleCtx *ctx, void *data) {
    WaitKey *w = data;
    w->armed = 0;
    RedisModule_SelectDb(ctx, w->dbid);
    /* The due job is in <base>delayed, or was moved to its lane already. */
    for (int i = 0; i < LANES; i++) RedisModule_SignalKeyAsReady(ctx, w->lanes[i]);
}

/* Bring the key's timer forward to due_ms (never back: a timer that fires
 * early only makes the claims look, find nothing, and re-arm). */
static void arm(RedisModuleCtx *ctx, WaitKey *w, long long due_ms, long long now_ms) {
    if (due_ms <= now_ms) return;
    if (w->armed && w->due <= due_ms) return;
    if (w->armed) RedisModule_StopTimer(ctx, w->timer, NULL);
    long long sleep = due_ms - now_ms;
    if (sleep > EMQ_WAKE_MAX_SLEEP_MS) sleep = EMQ_WAKE_MAX_SLEEP_MS;
    w->timer = RedisModule_CreateTimer(ctx, sleep, on_due, w);
    w->armed = 1;
    w->due = now_ms + sleep;
}

/* The server's free_privdata: one claim stopped waiting. */
static void stop_waiting(RedisModuleCtx *ctx, void *privdata) {
    WaitKey *w = privdata;
    if (--w->waiters > 0) return;
    if (w->armed) RedisModule_StopTimer(ctx, w->timer, NULL);
    RedisModule_DictDelC(registry, w->id, w->idlen, NULL);
    free_lanes(w->lanes);
    RedisModule_Free(w);
}

void emq_signal_claimable(RedisModuleCtx *ctx, RedisModuleString *pending) {
    /* Only a key with waiting claims costs more than a lookup. */
    WaitKey *w = find(RedisModule_GetSelectedDb(ctx), pending);
    if (w == NULL) return;
    RedisModule_SignalKeyAsReady(ctx, w->lanes[LANE_PENDING]);
    RedisModule_SignalKeyAsReady(ctx, w->lanes[LANE_PRIORITY]);
    RedisModule_SignalKeyAsReady(ctx, w->lanes[LANE_RING]);
}

void emq_signal_due(RedisModuleCtx *ctx, RedisModuleString *pending, long long due_ms, long long now_ms) {
    if (due_ms <= now_ms) {
        emq_signal_claimable(ctx, pending);
        return;
    }
    WaitKey *w = find(RedisModule_GetSelectedDb(ctx), pending);
    if (w) arm(ctx, w, due_ms, now_ms);
}

int emq_may_block(RedisModuleCtx *ctx) {
    const int deny = REDISMODULE_CTX_FLAGS_MULTI | REDISMODULE_CTX_FLAGS_LUA | REDISMODULE_CTX_FLAGS_DENY_BLOCKING;
    return !(RedisModule_GetContextFlags(ctx) & deny);
}

void emq_wait(RedisModuleCtx *ctx, RedisModuleString *pending, long long block_ms, long long next_due_ms,
              long long now_ms, RedisModuleCmdFunc reply, RedisModuleCmdFunc timeout) {
    WaitKey *w = find_or_add(RedisModule_GetSelectedDb(ctx), pending);
    w->waiters++;
    RedisModule_BlockClientOnKeys(ctx, reply, timeout, stop_waiting, block_ms, w->lanes, LANES, w);
    if (next_due_ms >= 0) arm(ctx, w, next_due_ms, now_ms);
}

void emq_wait_again(RedisModuleCtx *ctx, long long next_due_ms, long long now_ms) {
    WaitKey *w = RedisModule_GetBlockedClientPrivateData(ctx);
    if (w && next_due_ms >= 0) arm(ctx, w, next_due_ms, now_ms);
}

void emq_wake_unload(RedisModuleCtx *ctx) {
    (void)ctx;
    if (registry) RedisModule_FreeDict(NULL, registry);
    registry = NULL;
}
