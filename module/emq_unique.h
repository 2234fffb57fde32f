/* emq_unique.h -- unique jobs: ENQUEUE ... UNIQUE <key> [FOR <ms> | UNTIL done] [REPLACE].
 *
 * A unique key is a string <base>unique:<key> (in the queue's slot) whose
 * value is the id of the job holding it; the job's row keeps the key in its
 * `unique` field, so that the job's end can find it.
 *
 *   UNTIL done (the default)  the key is held while its job is pending or
 *                  active: the `ended` hook (emq_end.h) deletes it in the
 *                  same atomic step as the job ends (done, dead, cancelled)
 *                  or its row is deleted (FORGET, PURGE, OBLITERATE, the
 *                  dead retention).  A key whose holder has no row or one
 *                  that ended (a key left by hand, or by a server that lost
 *                  writes) is an orphan: the next enqueue takes it over.
 *   FOR <ms>       a throttle: the key carries an expiry (PEXPIREAT, absolute
 *                  as replicas and the AOF get it) and is held for that time
 *                  whatever its job does; only a verb that deletes the job's
 *                  row (FORGET, PURGE, OBLITERATE, SWEEP's dead retention)
 *                  takes it early -- not the end of the job, even when a
 *                  done or cancelled retention of 0 deletes the row in the
 *                  same step (the `ended` hook sees an end, not a deletion):
 *                  the window then outlives its row.
 *   REPLACE        a held key whose job is still pending gets the new
 *                  payload (debounce: the newest wins); an active or ended
 *                  holder keeps its payload and the call enqueues nothing.
 *
 * With UNIQUE the reply is [code, id]: 1 and the new job's id (created), 0
 * and the holder's id (nothing written), 2 and the holder's id (its payload
 * replaced).  Without UNIQUE, ENQUEUE's reply is unchanged. */
#ifndef EMQ_UNIQUE_H
#define EMQ_UNIQUE_H

#include "emq_effects.h"
#include "emq_end.h"
#include "emq_rm.h"

#define EMQ_UNIQUE_KEY_MAX 512
#define EMQ_UNIQUE_FOR_MAX 2592000000LL /* 30 days, in ms */

/* UNIQUE's options as parsed. */
typedef struct {
    RedisModuleString *key; /* borrowed from argv; NULL without UNIQUE */
    long long for_ms;       /* 0: UNTIL done */
    int replace, seen_until;
} EmqUniqueOpts;

/* The option at argv[i] if it is one of UNIQUE, FOR, UNTIL, REPLACE: how
 * many arguments it takes (2, or 1 for REPLACE), with *err set on a
 * refusal; 0 when it is none of them.  `u` NULL (ENQUEUEMANY): UNIQUE is
 * refused, the others are not its options. */
int emq_unique_option(EmqUniqueOpts *u, RedisModuleString **argv, int i, int argc, int *err);

/* After the last option: FOR, UNTIL and REPLACE need UNIQUE. */
int emq_unique_options_check(const EmqUniqueOpts *u);

/* What an enqueue finds. */
typedef enum { EMQ_UNIQUE_TAKE, EMQ_UNIQUE_HELD, EMQ_UNIQUE_REPLACE } EmqUniqueVerdict;

typedef struct {
    RedisModuleCtx *ctx;
    const EmqUniqueOpts *opts;
    RedisModuleString *name, *holder, *holder_name; /* owned */
    EmqKey key, holder_row;
    int verdict;
} EmqUnique;

/* Ready to decide (and to close) for the options `opts`. */
void emq_unique_init(EmqUnique *u, RedisModuleCtx *ctx, const EmqUniqueOpts *opts);

/* Open <base>unique:<key> (ACL: GET, SET), type-check it and decide: free
 * (or an orphan: TAKE), held (HELD), or held by a pending job and REPLACE
 * given (REPLACE; the holder's row opened for writing).  Without UNIQUE:
 * TAKE, nothing opened.  EMQ_OK or the error; close it either way. */
int emq_unique_decide(EmqUnique *u, RedisModuleUser *user, RedisModuleString *base);

/* TAKE: the key names `id` (SET, and PEXPIREAT now + FOR). */
void emq_unique_take(EmqUnique *u, EmqFx *fx, RedisModuleString *id, long long now);

/* REPLACE: the holder's payload becomes `payload` (its old pieces dropped). */
void emq_unique_replace(EmqUnique *u, EmqFx *fx, RedisModuleString *payload);

/* The reply with UNIQUE: [1, id] for a job created (or a retry of the call
 * that created it), [0 or 2, holder]. */
void emq_unique_reply(EmqUnique *u, RedisModuleString *id);

void emq_unique_close(EmqUnique *u);

/* -- the `ended` hook's step (emq_end.c) ---------------------------------- */

/* The job `id` ends `how`: when its row names a key that the job holds
 * (UNTIL done; or any, when the row is deleted), note its release.  Checks
 * the caller's ACL on the key (GET, DEL). */
int emq_unique_end_prepare(EmqEnd *e, RedisModuleString *id, int how, RedisModuleString *key);

/* DEL what prepare noted for `id`. */
void emq_unique_end_apply(EmqEnd *e, EmqFx *fx, RedisModuleString *id);

void emq_unique_end_close(EmqEnd *e);

#endif
