/* emq_effects.h -- every write a verb makes, in one place.
 *
 * A write has three parts, and a verb that wrote one by hand could forget
 * one of them:
 *   1. the change itself, through the low-level key API;
 *   2. the keyspace event the core command would fire (that API fires none);
 *   3. its propagation to replicas and the AOF, as a core command carrying
 *      absolute values, never the EMQ.* command (a replay must not read a
 *      clock of its own).
 * Each emq_fx_* call does all three.  Propagation is collected during the
 * command and sent by emq_fx_commit(): consecutive writes of one kind to one
 * key become one command (a 100,000-job sweep sends one ZREM with every id,
 * one HSET per row), and the server wraps several in MULTI/EXEC.
 *
 * Strings handed to these functions are borrowed: the layer keeps its own
 * reference to whatever it must propagate. */
#ifndef EMQ_EFFECTS_H
#define EMQ_EFFECTS_H

#include "emq_rm.h"

/* An open key a verb writes to.  `last` is the layer's bookkeeping (the
 * index of this key's latest propagated command, so the next write of the
 * same kind joins it); `modified` says the verb changed the key: only then
 * is it signalled as modified when closed (emq_key_close), so a verb that
 * wrote nothing -- an error, a no-op -- breaks no WATCH and sends no
 * client-tracking invalidation, as a core command that changes nothing. */
typedef struct {
    RedisModuleCtx *ctx;
    RedisModuleKey *key;
    RedisModuleString *name;
    int last;
    int modified;
} EmqKey;

typedef struct EmqFxEntry EmqFxEntry;

typedef struct {
    RedisModuleCtx *ctx;
    EmqFxEntry *entries;
    int n, cap;
    RedisModuleString **owned; /* numbers made for propagation, freed at commit */
    int nowned, capowned;
} EmqFx;

void emq_fx_begin(EmqFx *fx, RedisModuleCtx *ctx);

/* Propagate what was collected, in order, and release it.  Called once at
 * the end of every command, also when it wrote nothing. */
void emq_fx_commit(EmqFx *fx);

/* ZADD <set> [XX] <score> <member>.  Fires "zadd" and propagates only when
 * the member was added or its score changed, as ZADD does.  With xx on a
 * member that is not there (or an absent set), nothing happens and the
 * returned flags carry REDISMODULE_ZADD_NOP. */
int emq_fx_zadd(EmqFx *fx, EmqKey *set, long long score, RedisModuleString *member, int xx);

/* ZADD <set> <score> <m1> <score> <m2> ...: n members at one score, as ONE
 * core ZADD would: one "zadd" event when any member was added or re-scored,
 * and those members propagated in one ZADD.  Returns how many changed. */
long emq_fx_zadd_many(EmqFx *fx, EmqKey *set, long long score, RedisModuleString *const *members, long n);

/* ZREM <set> <member>.  Fires "zrem" (and "del" when that emptied the set)
 * when the member was there.  Returns 1 when it was removed. */
int emq_fx_zrem(EmqFx *fx, EmqKey *set, RedisModuleString *member);

/* ZADD <set> <s1> <m1> <s2> <m2> ...: n members, each at its own score, as
 * ONE core ZADD: one "zadd" event when any changed.  Returns how many. */
long emq_fx_zadd_pairs(EmqFx *fx, EmqKey *set, const long long *scores, RedisModuleString *const *members, long n);

/* ZREM <set> <m1> ... <mn>, as ONE core ZREM: one "zrem" event (and "del"
 * when the set is emptied) when any member was there.  Returns how many. */
long emq_fx_zrem_many(EmqFx *fx, EmqKey *set, RedisModuleString *const *members, long n);

/* RPUSH <list> m1 ... mn (tail) or LPUSH <list> m1 ... mn (head: mn ends
 * first, as LPUSH does), as ONE core command: one "rpush"/"lpush" event. */
void emq_fx_push(EmqFx *fx, EmqKey *list, int head, RedisModuleString *const *members, long n);

/* LPOP <list> <n>: the n head entries leave the list (one "lpop" event, and
 * "del" when it is emptied); the caller read them already (a claim decides
 * on what it read, then pops).  Returns how many were popped. */
long emq_fx_lpop(EmqFx *fx, EmqKey *list, long n);

/* HSET <row> f1 v1 ... fn vn from arrays (a row's pieces: their number
 * depends on the value).  Fires `event` once. */
void emq_fx_hset_argv(EmqFx *fx, EmqKey *row, const char *event, int npairs, RedisModuleString *const *fields,
                      RedisModuleString *const *values);

/* HSET <row> f1 v1 ... fn vn: `npairs` (field, value) RedisModuleString
 * pairs follow.  Fires `event` ("hset", or "hincrby" where the core command
 * would be HINCRBY) once.  Consecutive HSETs of one row propagate as one. */
void emq_fx_hset(EmqFx *fx, EmqKey *row, const char *event, int npairs, ...);

/* HDEL <row> <field>, when the field is there: fires "hdel".  Returns 1
 * when it was removed. */
int emq_fx_hdel(EmqFx *fx, EmqKey *row, RedisModuleString *field);

/* SET <key> <value> (a string key): fires "set". */
void emq_fx_set(EmqFx *fx, EmqKey *key, RedisModuleString *value);

/* PEXPIREAT <key> <at-ms>: fires "expire".  The absolute time is what a
 * replica and the AOF receive, so a replay expires the key when the master
 * did, whatever its own clock says.  Right after the key's emq_fx_set, the
 * two propagate as one SET <key> <value> PXAT <at-ms>. */
void emq_fx_pexpireat(EmqFx *fx, EmqKey *key, long long at_ms);

/* PERSIST <key>, when it has an expiry: fires "persist". */
void emq_fx_persist(EmqFx *fx, EmqKey *key);

/* DEL <key>, when it exists: fires "del". */
void emq_fx_del(EmqFx *fx, EmqKey *key);

/* A finished row's retention (emq_core's emq_retain): kept, expired at
 * now + ttl, or deleted at once. */
void emq_fx_retain(EmqFx *fx, EmqKey *row, long long now_ms, long long ttl_ms);

/* A decimal string for `v` that lives until emq_fx_commit(). */
RedisModuleString *emq_fx_number(EmqFx *fx, long long v);

/* A string made for a write (a piece of a value): the layer frees it at
 * emq_fx_commit(), after propagating it.  Returns s. */
RedisModuleString *emq_fx_own(EmqFx *fx, RedisModuleString *s);

#endif
