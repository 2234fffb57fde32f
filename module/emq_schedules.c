/* emq_schedules.c -- the server fires due schedule ticks itself: see
 * emq_schedules.h for what; here is how.
 *
 * The index.  Which keys are schedule sets is learnt without a client: a
 * bounded scan of every database (at load, after an RDB/AOF load, when the
 * node becomes a master, after SWAPDB), then the keyspace events of the
 * zset keys named emq:{Q}:schedules (a ZADD adds the key; DEL, expiry,
 * eviction, RENAME and MOVE away drop it).  An entry is (database, key): a
 * client may use any database.  The index is only a list of where to look:
 * the timer reads each set itself, and drops an entry whose key is gone.
 *
 * The timer.  It runs only while there is something to do -- a scan under
 * way, or an indexed set -- on a master with emq.schedule-timer yes: a
 * server without schedules holds no timer.  After a run it sleeps until
 * the earliest tick ahead among the sets it saw, at most
 * EMQ_SCHEDULE_TIMER_MS (1 ms when it left due work).  Each run fires at most
 * FIRE_BUDGET schedules (and stops once JOB_BUDGET jobs are enqueued),
 * reads at most EXAMINE_BUDGET due names and visits at most SETS_PER_RUN
 * sets, resuming the next run at the set where it stopped.
 *
 * A fire.  What a client's drive sends in its MULTI (schedules.fire_calls
 * and advance_commands), sent with RedisModule_Call and "!": EMQ.ENQUEUE of
 * each fired tick (id <name>@<tick>; "exists" counts as fired, as the
 * clients count it), HSET last/ticks, HINCRBY fired, ZADD the next tick.
 * A timer run is one execution unit: the server replicates all its writes
 * as one MULTI/EXEC, and no client command runs in between, so a client's
 * WATCH on the row sees the server's write and its EXEC is refused.
 *
 * Rows the timer leaves alone until they change (the `quiet` dict, cleared
 * by the row's keyspace events): a malformed one (logged once) and a cron
 * one whose stored ticks are all due (the clients' drivers compute the next
 * ones with cronsim; `echomq check` reports it). */
#include "emq_schedules.h"

#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "emq.h"

/* -- the index ------------------------------------------------------------- */

#define FIRE_BUDGET 32       /* schedules fired per run */
#define JOB_BUDGET 256       /* a run stops once it enqueued this many jobs */
#define EXAMINE_BUDGET 64    /* due names read per run */
#define SETS_PER_RUN 256     /* sets visited per run */
#define SKIP_CEILING 1000    /* quiet names passed over in one set per run (schedules.MAX_SCHEDULES) */
#define SCAN_KEYS_PER_RUN 1000
#define SCAN_STEPS_PER_RUN 4000 /* scan steps (buckets, some empty) per run */
#define SCAN_TIMER_MS 1

static const char SET_PREFIX[] = "emq:{";
static const char SET_SUFFIX[] = "}:schedules";
static const char ROW_MARK[] = "}:schedule:";

typedef struct {
    int db;
    size_t pos; /* in sets[] */
    size_t idlen;
    char id[]; /* db, then the key's name */
} SetEntry;

static RedisModuleDict *index_dict, *quiet;
static SetEntry **sets;
static size_t nsets, capsets, next_set;

/* What one run learnt of the next: the earliest tick ahead among the sets
 * it visited (a timer sleeps until then, at most EMQ_SCHEDULE_TIMER_MS), and
 * whether it left due work for want of budget (the next run comes at once). */
static long long next_due;
static int backlog;

static void saw_next(double score) {
    if (score < (double)next_due) next_due = (long long)score; /* +inf never is */
}

static int loaded;      /* subscribed, and the index is ours to keep */
static int running;     /* inside a timer run: the keyspace callback adds, never frees */
static int internal;    /* inside our own RedisModule_Call */
static int scanning, scan_db, scan_seen_db;
static RedisModuleScanCursor *scan_cursor;
static int armed;
static RedisModuleTimerID timer;
static RedisModuleCtx *timer_ctx; /* detached: CONFIG SET's callback has no context */

int emq_schedules_internal_call(void) {
    return internal;
}

static size_t make_id(int db, const char *name, size_t len, char *buf, size_t bufsize, char **out) {
    size_t idlen = sizeof db + len;
    char *p = idlen <= bufsize ? buf : RedisModule_Alloc(idlen);
    memcpy(p, &db, sizeof db);
    memcpy(p + sizeof db, name, len);
    *out = p;
    return idlen;
}

static int is_set_name(const char *k, size_t len) {
    size_t pl = sizeof SET_PREFIX - 1, sl = sizeof SET_SUFFIX - 1;
    return len > pl + sl && memcmp(k, SET_PREFIX, pl) == 0 && memcmp(k + len - sl, SET_SUFFIX, sl) == 0;
}

/* emq:{Q}:schedule:<name>: the mark right after the hash tag's first '}'
 * (as the server reads a hash tag), so a job row's event costs a memchr. */
static int is_row_name(const char *k, size_t len) {
    size_t pl = sizeof SET_PREFIX - 1, ml = sizeof ROW_MARK - 1;
    if (len <= pl + ml || memcmp(k, SET_PREFIX, pl) != 0) return 0;
    const char *close = memchr(k + pl, '}', len - pl);
    return close && (size_t)(k + len - close) > ml && memcmp(close, ROW_MARK, ml) == 0;
}

static void index_add(int db, const char *name, size_t len) {
    char small[256], *id;
    size_t idlen = make_id(db, name, len, small, sizeof small, &id);
    int nokey = 1;
    if (index_dict == NULL) index_dict = RedisModule_CreateDict(NULL);
    RedisModule_DictGetC(index_dict, id, idlen, &nokey);
    if (nokey) {
        SetEntry *e = RedisModule_Alloc(sizeof *e + idlen);
        e->db = db;
        e->idlen = idlen;
        memcpy(e->id, id, idlen);
        if (nsets == capsets) {
            capsets = capsets ? capsets * 2 : 16;
            sets = RedisModule_Realloc(sets, capsets * sizeof *sets);
        }
        e->pos = nsets;
        sets[nsets++] = e;
        RedisModule_DictSetC(index_dict, e->id, e->idlen, e);
    }
    if (id != small) RedisModule_Free(id);
}

static void index_remove(SetEntry *e) {
    RedisModule_DictDelC(index_dict, e->id, e->idlen, NULL);
    size_t pos = e->pos;
    sets[pos] = sets[--nsets];
    sets[pos]->pos = pos;
    RedisModule_Free(e);
}

static void index_remove_name(int db, const char *name, size_t len) {
    if (index_dict == NULL) return;
    char small[256], *id;
    size_t idlen = make_id(db, name, len, small, sizeof small, &id);
    int nokey = 1;
    SetEntry *e = RedisModule_DictGetC(index_dict, id, idlen, &nokey);
    if (id != small) RedisModule_Free(id);
    if (!nokey) index_remove(e);
}

static void quiet_clear(void) {
    if (quiet) RedisModule_FreeDict(NULL, quiet);
    quiet = NULL;
}

static void index_clear(void) {
    for (size_t i = 0; i < nsets; i++) RedisModule_Free(sets[i]);
    RedisModule_Free(sets);
    sets = NULL;
    nsets = capsets = next_set = 0;
    if (index_dict) RedisModule_FreeDict(NULL, index_dict);
    index_dict = NULL;
    quiet_clear();
}

/* Is (db, row name) quiet; make it so; forget it. */
static int quiet_has(int db, const char *name, size_t len) {
    if (quiet == NULL) return 0;
    char small[256], *id;
    size_t idlen = make_id(db, name, len, small, sizeof small, &id);
    int nokey = 1;
    RedisModule_DictGetC(quiet, id, idlen, &nokey);
    if (id != small) RedisModule_Free(id);
    return !nokey;
}

static void quiet_set(int db, const char *name, size_t len) {
    if (quiet == NULL) quiet = RedisModule_CreateDict(NULL);
    char small[256], *id;
    size_t idlen = make_id(db, name, len, small, sizeof small, &id);
    RedisModule_DictSetC(quiet, id, idlen, (void *)1);
    if (id != small) RedisModule_Free(id);
}

static void quiet_del(int db, const char *name, size_t len) {
    if (quiet == NULL || RedisModule_DictSize(quiet) == 0) return;
    char small[256], *id;
    size_t idlen = make_id(db, name, len, small, sizeof small, &id);
    RedisModule_DictDelC(quiet, id, idlen, NULL);
    if (id != small) RedisModule_Free(id);
}

/* -- the timer ------------------------------------------------------------- */

static int is_master(RedisModuleCtx *ctx) {
    int flags = RedisModule_GetContextFlags(ctx);
    return (flags & REDISMODULE_CTX_FLAGS_MASTER) && !(flags & REDISMODULE_CTX_FLAGS_LOADING);
}

static void on_timer(RedisModuleCtx *ctx, void *data);

/* Arm the timer, in period_ms, when there is work and this node may do it. */
static void arm_in(long long period_ms) {
    if (!loaded || armed || !emq_config_schedule_timer() || !is_master(timer_ctx)) return;
    if (!scanning && nsets == 0) return;
    if (scanning) period_ms = SCAN_TIMER_MS;
    timer = RedisModule_CreateTimer(timer_ctx, period_ms, on_timer, NULL);
    armed = 1;
}

static void rearm(void) {
    arm_in(EMQ_SCHEDULE_TIMER_MS);
}

static void disarm(void) {
    if (armed) RedisModule_StopTimer(timer_ctx, timer, NULL);
    armed = 0;
}

static void scan_start(void) {
    scanning = 1;
    scan_db = 0;
    scan_seen_db = 0;
    if (scan_cursor) RedisModule_ScanCursorDestroy(scan_cursor);
    scan_cursor = RedisModule_ScanCursorCreate();
}

static void scan_stop(void) {
    scanning = 0;
    if (scan_cursor) RedisModule_ScanCursorDestroy(scan_cursor);
    scan_cursor = NULL;
}

static void on_scanned(RedisModuleCtx *ctx, RedisModuleString *keyname, RedisModuleKey *key, void *privdata) {
    (void)ctx;
    (void)key;
    long *seen = privdata;
    size_t len;
    const char *k = RedisModule_StringPtrLen(keyname, &len);
    (*seen)++;
    if (is_set_name(k, len)) index_add(scan_db, k, len);
}

/* One bounded step of the scan of every database (SelectDb refuses the
 * first number past `databases`: the scan is done). */
static void scan_step(RedisModuleCtx *ctx) {
    long seen = 0;
    int steps = 0;
    while (scanning && seen < SCAN_KEYS_PER_RUN && steps < SCAN_STEPS_PER_RUN) {
        if (!scan_seen_db) {
            if (RedisModule_SelectDb(ctx, scan_db) != REDISMODULE_OK) {
                scan_stop();
                break;
            }
            scan_seen_db = 1;
        }
        RedisModule_SelectDb(ctx, scan_db);
        steps++;
        if (!RedisModule_Scan(ctx, scan_cursor, on_scanned, &seen)) {
            scan_db++;
            scan_seen_db = 0;
            RedisModule_ScanCursorDestroy(scan_cursor);
            scan_cursor = RedisModule_ScanCursorCreate();
        }
    }
}

/* Our own calls: replicated ("!"), and marked internal so that our verbs
 * know there is no client user to check (emq_acl_user).  The reply, or
 * NULL when the server refused to run the command (logged). */
static RedisModuleCallReply *call_replicated(RedisModuleCtx *ctx, const char *cmd, RedisModuleCallReply *r) {
    if (r == NULL) RedisModule_Log(ctx, "warning", "schedule timer: the server refused to run %s", cmd);
    return r;
}

static RedisModuleCallReply *reply_;
#define CALL(ctx, cmd, fmt, ...) \
    (internal = 1, reply_ = RedisModule_Call(ctx, cmd, fmt, __VA_ARGS__), internal = 0, \
     call_replicated(ctx, cmd, reply_))

static void call_and_free(RedisModuleCallReply *r) {
    if (r) RedisModule_FreeCallReply(r);
}

static RedisModuleString *hash_field(RedisModuleKey *key, const char *field) {
    RedisModuleString *v = NULL;
    RedisModule_HashGet(key, REDISMODULE_HASH_CFIELDS, field, &v, NULL);
    return v;
}

static const char *ptr(RedisModuleString *s, size_t *len) {
    *len = 0;
    return s ? RedisModule_StringPtrLen(s, len) : NULL;
}

/* The names a set's fires write, made once per visit. */
typedef struct {
    RedisModuleString *set, *base, *pending;
    const char *b;
    size_t blen;
} SetNames;

/* Enqueue the fired ticks and advance the cursor, as the clients' EXEC. */
static int write_firing(RedisModuleCtx *ctx, const SetNames *n, RedisModuleString *rowname, RedisModuleString *member,
                        RedisModuleString *payload, const EmqScheduleFiring *firing) {
    size_t mlen;
    const char *m = RedisModule_StringPtrLen(member, &mlen);
    for (int i = 0; i < firing->nfire; i++) {
        char id[160];
        int idlen = snprintf(id, sizeof id, "%.*s@%lld", (int)mlen, m, firing->fire[i]);
        RedisModuleString *job = RedisModule_CreateString(ctx, id, (size_t)idlen);
        RedisModuleCallReply *r = CALL(ctx, "EMQ.ENQUEUE", "!ssss", n->pending, n->base, job, payload);
        if (r && RedisModule_CallReplyType(r) == REDISMODULE_REPLY_ERROR) {
            size_t elen;
            const char *err = RedisModule_CallReplyStringPtr(r, &elen);
            if (!(elen >= 9 && memcmp(err, "EMQEXISTS", 9) == 0)) /* exists: fired before, counted */
                RedisModule_Log(ctx, "warning", "schedule timer: the tick's job %s of %.*s was not enqueued: %.*s",
                                id, (int)n->blen, n->b, (int)(elen > 200 ? 200 : elen), err ? err : "");
        }
        call_and_free(r);
        RedisModule_FreeString(ctx, job);
    }
    char ticks[EMQ_SCHEDULE_STORED_TICKS * 21 + 1];
    size_t tlen = 0;
    for (int i = 0; i < firing->nupcoming; i++)
        tlen += (size_t)snprintf(ticks + tlen, sizeof ticks - tlen, "%s%lld", i ? "," : "", firing->upcoming[i]);
    call_and_free(CALL(ctx, "HSET", "!sclcb", rowname, "last", firing->cursor, "ticks", ticks, tlen));
    if (firing->nfire) call_and_free(CALL(ctx, "HINCRBY", "!scl", rowname, "fired", (long long)firing->nfire));
    char score[24] = "+inf";
    if (firing->nupcoming) {
        snprintf(score, sizeof score, "%lld", firing->upcoming[0]);
        saw_next((double)firing->upcoming[0]);
    }
    call_and_free(CALL(ctx, "ZADD", "!scs", n->set, score, member));
    return firing->nfire;
}

enum { F_CRON, F_EVERY, F_START, F_END, F_MISSED, F_LAST, F_TICKS, F_PAYLOAD, FIELDS };
static const char *const field_names[FIELDS] = {"cron", "every_ms", "start_at", "end_at",
                                                 "missed", "last", "ticks", "payload"};

/* Fire one due schedule: the number of jobs enqueued, or -1 when its row
 * is left alone until it changes (malformed: logged once; a cron out of
 * stored ticks). */
static int fire_one(RedisModuleCtx *ctx, SetEntry *e, const SetNames *n, RedisModuleString *member, long long now,
                    long long *buf) {
    size_t mlen;
    const char *m = RedisModule_StringPtrLen(member, &mlen);
    char small[512];
    size_t rowlen = n->blen + 9 + mlen;
    char *rowbuf = rowlen <= sizeof small ? small : RedisModule_Alloc(rowlen);
    memcpy(rowbuf, n->b, n->blen);
    memcpy(rowbuf + n->blen, "schedule:", 9);
    memcpy(rowbuf + n->blen + 9, m, mlen);
    RedisModuleString *rowname = RedisModule_CreateString(ctx, rowbuf, rowlen);
    RedisModuleString *f[FIELDS] = {0};
    const char *bad = NULL;
    int result = -1, gone = 0;
    RedisModuleKey *row = RedisModule_OpenKey(ctx, rowname, REDISMODULE_READ);
    int type = RedisModule_KeyType(row);
    if (!emq_schedule_name_ok(m, mlen))
        bad = "its name is not 1 to 128 of A-Z a-z 0-9 _ . : -";
    else if (type == REDISMODULE_KEYTYPE_EMPTY)
        gone = 1;
    else if (type != REDISMODULE_KEYTYPE_HASH)
        bad = "the row is not a hash";
    else
        for (int i = 0; i < FIELDS; i++) f[i] = hash_field(row, field_names[i]);
    RedisModule_CloseKey(row);
    if (gone) { /* removed meanwhile: no entry to keep, as a client's drive does */
        call_and_free(CALL(ctx, "ZREM", "!ss", n->set, member));
        result = 0;
    } else if (!bad) {
        size_t l[FIELDS];
        const char *p[FIELDS];
        for (int i = 0; i < FIELDS; i++) p[i] = ptr(f[i], &l[i]);
        EmqScheduleRow parsed;
        bad = emq_schedule_parse(&parsed, p[F_CRON], l[F_CRON], p[F_EVERY], l[F_EVERY], p[F_START], l[F_START],
                                 p[F_END], l[F_END], p[F_MISSED], l[F_MISSED], p[F_LAST], l[F_LAST], p[F_TICKS],
                                 l[F_TICKS]);
        if (!bad) {
            EmqScheduleFiring firing;
            firing.fire = buf;
            if (emq_schedule_plan(&parsed, now, &firing) == EMQ_PLAN_OUT_OF_TICKS) {
                quiet_set(e->db, rowbuf, rowlen); /* not logged: the clients' drivers top the ticks up */
            } else {
                if (f[F_PAYLOAD] == NULL) f[F_PAYLOAD] = RedisModule_CreateString(ctx, "", 0);
                result = write_firing(ctx, n, rowname, member, f[F_PAYLOAD], &firing);
            }
        }
    }
    if (bad) {
        if (!quiet_has(e->db, rowbuf, rowlen))
            RedisModule_Log(ctx, "warning", "schedule timer: %.*s is not fired until it changes: %s",
                            (int)(rowlen > 300 ? 300 : rowlen), rowbuf, bad);
        quiet_set(e->db, rowbuf, rowlen);
    }
    for (int i = 0; i < FIELDS; i++)
        if (f[i]) RedisModule_FreeString(ctx, f[i]);
    RedisModule_FreeString(ctx, rowname);
    if (rowbuf != small) RedisModule_Free(rowbuf);
    return result;
}

typedef struct {
    int fired, jobs, examined;
} Budget;

static int budget_left(const Budget *b) {
    return b->fired < FIRE_BUDGET && b->jobs < JOB_BUDGET && b->examined < EXAMINE_BUDGET;
}

/* Fire the set's due schedules within the budget: 1 when nothing due is
 * left in it (or it is gone: the entry is dropped, *dropped set). */
static int fire_set(RedisModuleCtx *ctx, SetEntry *e, long long now, Budget *b, long long *buf, int *dropped) {
    *dropped = 0;
    RedisModule_SelectDb(ctx, e->db);
    SetNames n;
    const char *k = e->id + sizeof e->db;
    size_t klen = e->idlen - sizeof e->db;
    n.set = RedisModule_CreateString(ctx, k, klen);
    RedisModuleKey *key = RedisModule_OpenKey(ctx, n.set, REDISMODULE_READ);
    if (RedisModule_KeyType(key) != REDISMODULE_KEYTYPE_ZSET) {
        RedisModule_CloseKey(key);
        RedisModule_FreeString(ctx, n.set);
        index_remove(e);
        *dropped = 1;
        return 1;
    }
    n.b = k;
    n.blen = klen - 9; /* without "schedules" */
    RedisModuleString *due[EXAMINE_BUDGET];
    int ndue = 0, skipped = 0, more = 0;
    RedisModule_ZsetFirstInScoreRange(key, -HUGE_VAL, (double)now, 0, 0);
    while (!RedisModule_ZsetRangeEndReached(key)) {
        if (ndue >= EXAMINE_BUDGET - b->examined || skipped >= SKIP_CEILING) {
            more = 1;
            break;
        }
        double score;
        RedisModuleString *m = RedisModule_ZsetRangeCurrentElement(key, &score);
        size_t mlen;
        const char *mp = RedisModule_StringPtrLen(m, &mlen);
        char small[512];
        size_t rowlen = n.blen + 9 + mlen;
        char *rowbuf = rowlen <= sizeof small ? small : RedisModule_Alloc(rowlen);
        memcpy(rowbuf, n.b, n.blen);
        memcpy(rowbuf + n.blen, "schedule:", 9);
        memcpy(rowbuf + n.blen + 9, mp, mlen);
        int q = quiet_has(e->db, rowbuf, rowlen);
        if (rowbuf != small) RedisModule_Free(rowbuf);
        if (q) {
            skipped++;
            RedisModule_FreeString(ctx, m);
        } else {
            due[ndue++] = m;
        }
        RedisModule_ZsetRangeNext(key);
    }
    RedisModule_ZsetRangeStop(key);
    /* The set's first tick ahead of now, for the timer's sleep. */
    if (RedisModule_ZsetFirstInScoreRange(key, (double)now, HUGE_VAL, 1, 0) == REDISMODULE_OK &&
        !RedisModule_ZsetRangeEndReached(key)) {
        double score;
        RedisModuleString *m = RedisModule_ZsetRangeCurrentElement(key, &score);
        if (m) RedisModule_FreeString(ctx, m);
        saw_next(score);
    }
    RedisModule_ZsetRangeStop(key);
    RedisModule_CloseKey(key);
    n.base = RedisModule_CreateString(ctx, n.b, n.blen);
    n.pending = emq_derived_key(ctx, n.base, "pending", NULL);
    int i = 0;
    for (; i < ndue && budget_left(b); i++) {
        b->examined++;
        int jobs = fire_one(ctx, e, &n, due[i], now, buf);
        if (jobs >= 0) {
            b->fired++;
            b->jobs += jobs;
        }
    }
    if (i < ndue) more = 1;
    if (more) backlog = 1;
    for (int j = 0; j < ndue; j++) RedisModule_FreeString(ctx, due[j]);
    RedisModule_FreeString(ctx, n.pending);
    RedisModule_FreeString(ctx, n.base);
    RedisModule_FreeString(ctx, n.set);
    return !more;
}

static void fire_step(RedisModuleCtx *ctx) {
    long long now = RedisModule_Milliseconds();
    static long long buf[EMQ_SCHEDULE_MISSED_CEILING];
    Budget b = {0, 0, 0};
    size_t visits = 0, limit = nsets < SETS_PER_RUN ? nsets : SETS_PER_RUN;
    next_due = LLONG_MAX;
    backlog = nsets > SETS_PER_RUN; /* sets this run does not visit: look again soon */
    while (nsets && visits < limit && budget_left(&b)) {
        if (next_set >= nsets) next_set = 0;
        int dropped, done = fire_set(ctx, sets[next_set], now, &b, buf, &dropped);
        visits++;
        if (!dropped && done) next_set++; /* a dropped entry's place holds another set now */
    }
}

static void on_timer(RedisModuleCtx *ctx, void *data) {
    (void)data;
    armed = 0;
    if (!emq_config_schedule_timer() || !is_master(ctx)) return;
    running = 1;
    int db = RedisModule_GetSelectedDb(ctx);
    if (scanning) scan_step(ctx);
    /* Past maxmemory a client's drive is refused whole (EMQ.ENQUEUE is
     * deny-oom, and so its EXEC): the timer waits as well, and the ticks
     * meanwhile are handled by `missed` once memory is back. */
    if (!(RedisModule_GetContextFlags(ctx) & REDISMODULE_CTX_FLAGS_OOM)) fire_step(ctx);
    else next_due = LLONG_MAX, backlog = 0;
    RedisModule_SelectDb(ctx, db);
    running = 0;
    /* Sleep until the earliest tick ahead (at most the period), so that a
     * tick fires within about a millisecond of its time, not up to 50. */
    long long period = EMQ_SCHEDULE_TIMER_MS, now = RedisModule_Milliseconds();
    if (backlog)
        period = 1;
    else if (next_due - now < period)
        period = next_due - now < 1 ? 1 : next_due - now;
    arm_in(period);
}

/* -- what keeps the index -------------------------------------------------- */

static int on_keyspace(RedisModuleCtx *ctx, int type, const char *event, RedisModuleString *key) {
    (void)type;
    if (!loaded || !emq_config_schedule_timer()) return REDISMODULE_OK;
    size_t len;
    const char *k = RedisModule_StringPtrLen(key, &len);
    int db = RedisModule_GetSelectedDb(ctx);
    if (is_set_name(k, len)) {
        int away = strcmp(event, "del") == 0 || strcmp(event, "expired") == 0 || strcmp(event, "evicted") == 0 ||
                   strcmp(event, "rename_from") == 0 || strcmp(event, "move_from") == 0;
        if (!away)
            index_add(db, k, len);
        else if (!running) /* during a run the timer drops it itself when it finds the key gone */
            index_remove_name(db, k, len);
        rearm();
    } else if (is_row_name(k, len)) {
        quiet_del(db, k, len); /* changed: look at it again */
    }
    return REDISMODULE_OK;
}

/* Start over: forget the index, scan every database. */
static void rebuild(RedisModuleCtx *ctx) {
    disarm();
    index_clear();
    scan_stop();
    if (!emq_config_schedule_timer()) return;
    scan_start();
    /* A small keyspace is indexed at once, and then no timer is left
     * pending unless there are schedules (MODULE UNLOAD refuses a module
     * that holds a timer). */
    if (is_master(ctx)) {
        int db = RedisModule_GetSelectedDb(ctx);
        scan_step(ctx);
        RedisModule_SelectDb(ctx, db);
    }
    rearm();
}

static void on_role(RedisModuleCtx *ctx, RedisModuleEvent eid, uint64_t subevent, void *data) {
    (void)eid;
    (void)data;
    if (subevent == REDISMODULE_EVENT_REPLROLECHANGED_NOW_MASTER) {
        rebuild(ctx);
    } else { /* a replica never fires */
        disarm();
        index_clear();
        scan_stop();
    }
}

static void on_loading(RedisModuleCtx *ctx, RedisModuleEvent eid, uint64_t subevent, void *data) {
    (void)eid;
    (void)data;
    if (subevent == REDISMODULE_SUBEVENT_LOADING_ENDED || subevent == REDISMODULE_SUBEVENT_LOADING_FAILED) {
        rebuild(ctx);
    } else {
        disarm();
        index_clear();
        scan_stop();
    }
}

static void on_flush(RedisModuleCtx *ctx, RedisModuleEvent eid, uint64_t subevent, void *data) {
    (void)ctx;
    (void)eid;
    if (subevent != REDISMODULE_SUBEVENT_FLUSHDB_END) return;
    const RedisModuleFlushInfo *fi = data;
    if (fi->dbnum < 0) {
        index_clear();
    } else {
        for (size_t i = nsets; i-- > 0;)
            if (sets[i]->db == fi->dbnum) index_remove(sets[i]);
        quiet_clear();
        next_set = 0;
    }
    if (scanning) scan_start(); /* the scan's cursor is of the old tables */
    if (nsets == 0 && !scanning) disarm();
}

static void on_swapdb(RedisModuleCtx *ctx, RedisModuleEvent eid, uint64_t subevent, void *data) {
    (void)eid;
    (void)subevent;
    (void)data;
    rebuild(ctx);
}

void emq_schedules_setting_changed(void) {
    if (!loaded) return;
    if (!emq_config_schedule_timer()) {
        disarm();
        index_clear();
        scan_stop();
        return;
    }
    if (!scanning && nsets == 0) {
        scan_start();
        rearm();
    }
}

int emq_schedules_load(RedisModuleCtx *ctx) {
    static const struct {
        uint64_t id;
        RedisModuleEventCallback cb;
    } events[] = {
        {REDISMODULE_EVENT_REPLICATION_ROLE_CHANGED, on_role},
        {REDISMODULE_EVENT_LOADING, on_loading},
        {REDISMODULE_EVENT_FLUSHDB, on_flush},
        {REDISMODULE_EVENT_SWAPDB, on_swapdb},
    };
    if (RedisModule_SubscribeToKeyspaceEvents(ctx, REDISMODULE_NOTIFY_GENERIC | REDISMODULE_NOTIFY_ZSET |
                                                       REDISMODULE_NOTIFY_HASH,
                                              on_keyspace) != REDISMODULE_OK) {
        RedisModule_Log(ctx, "warning", "not loaded: the server refused our keyspace event subscription");
        return REDISMODULE_ERR;
    }
    for (size_t i = 0; i < sizeof events / sizeof *events; i++) {
        RedisModuleEvent ev = {events[i].id, 1};
        if (RedisModule_SubscribeToServerEvent(ctx, ev, events[i].cb) != REDISMODULE_OK) {
            RedisModule_Log(ctx, "warning", "not loaded: the server refused our subscription to server event %llu",
                            (unsigned long long)events[i].id);
            return REDISMODULE_ERR;
        }
    }
    timer_ctx = RedisModule_GetDetachedThreadSafeContext(ctx);
    loaded = 1;
    /* At server start the data is not loaded yet: the loading event scans. */
    if (!(RedisModule_GetContextFlags(ctx) & REDISMODULE_CTX_FLAGS_LOADING)) rebuild(ctx);
    return REDISMODULE_OK;
}

void emq_schedules_unload(RedisModuleCtx *ctx) {
    (void)ctx;
    disarm();
    index_clear();
    scan_stop();
    loaded = 0;
    if (timer_ctx) RedisModule_FreeThreadSafeContext(timer_ctx);
    timer_ctx = NULL;
}
