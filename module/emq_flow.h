/* emq_flow.h -- flow control (issue 32): a queue's rate limit and its
 * back-off, kept in <base>limit and checked by every claim.
 *
 * <base>limit is a hash (absent: no limit): `max` and `per_ms` (the rate:
 * at most `max` jobs handed out per window of `per_ms`), `window` and
 * `used` (the window the count is for, and the count), `backoff_until`
 * (no claim before this server time: a handler's 429).  The window is
 * fixed and aligned to the server clock, [k * per_ms, (k + 1) * per_ms):
 * emq_core.c's emq_rate_allowance decides, from what is stored and the
 * one reading of the clock the verb made.
 *
 * CLAIM and COMPLETECLAIM call emq_flow_claim_prepare before they take
 * jobs (the most they may take, or none and when to look again: the timer
 * of a waiting claim is armed there, emq_wake.h) and
 * emq_flow_claim_apply with the number they took. */
#ifndef EMQ_FLOW_H
#define EMQ_FLOW_H

#include "emq_core.h"
#include "emq_effects.h"
#include "emq_rm.h"

/* What <base>limit holds (0 where a field is absent). */
typedef struct {
    long long max, per; /* the rate: both 0 (none) or both set */
    long long window;   /* the start of the window `used` counts */
    long long used;     /* claims handed out in that window */
    long long until;    /* the back-off: no claim before this server time */
} EmqRate;

typedef struct {
    RedisModuleCtx *ctx;
    RedisModuleString *name; /* <base>limit */
    EmqKey key;
    EmqRate rate;
    long long start, used; /* the current window's start and its use before this call */
    long long set_until;   /* a back-off to write (RELEASE ... BACKOFF), or 0 */
} EmqFlow;

/* Open and read <base>limit (`user`: the caller's ACL, or NULL).  EMQ_OK
 * and *allowance: -1 (no limit), 0 (refused: *reopen is when to look
 * again) or the most jobs the claim may take; or the error, nothing
 * written. */
int emq_flow_claim_prepare(EmqFlow *f, RedisModuleCtx *ctx, RedisModuleUser *user, RedisModuleString *base,
                           long long now, long long *allowance, long long *reopen);

/* The claim took `n` jobs: the window's use goes up (HSET window used,
 * absolute), when a rate is set and n > 0. */
void emq_flow_claim_apply(EmqFlow *f, EmqFx *fx, long n);

/* RELEASE ... BACKOFF <ms> (a handler's 429): open and read <base>limit
 * and decide the back-off's end, server-now + ms, written only when later
 * than the one stored (ms 0: nothing).  EMQ_OK or the error, nothing
 * written. */
int emq_flow_backoff_prepare(EmqFlow *f, RedisModuleCtx *ctx, RedisModuleUser *user, RedisModuleString *base,
                             long long now, long long ms);
void emq_flow_backoff_apply(EmqFlow *f, EmqFx *fx);

/* Always after prepare (also on an error); harmless on a zeroed EmqFlow. */
void emq_flow_close(EmqFlow *f);

int EmqLimit_RedisCommand(RedisModuleCtx *ctx, RedisModuleString **argv, int argc);

#endif
