/* emq_wake.h -- claims that wait for work (EMQ.CLAIM ... BLOCK), and what
 * wakes them.
 *
 * A waiting claim is a client blocked on its queue's lanes -- <pending>,
 * <base>priority and <base>delayed -- the way BZPOPMIN blocks
 * (RedisModule_BlockClientOnKeys).  The server calls the
 * claim's reply callback, in the order the clients blocked, whenever the
 * key is signalled ready; the callback runs the same claim and either
 * answers or stays blocked.  Two things signal a <pending>:
 *
 *   - a verb that makes a job claimable now: ENQUEUE(MANY) without a delay,
 *     FAIL back to pending, SWEEP's recoveries, RELEASE -- and, from the
 *     operator's verbs, RESUME and RETRY: every one calls
 *     emq_signal_claimable() (or emq_signal_due(), which does it for a due
 *     time that is already here) after its writes;
 *   - a delayed job falling due: one module timer per waited-on <pending>,
 *     armed for the earliest future due time the waiting claims know of
 *     (emq_signal_due() for a job added with a delay, and every claim that
 *     blocks or stays blocked arms it for the head of the delayed jobs).
 *
 * Nothing here writes data: a signal only makes the server run the waiting
 * claims, which write (through emq_effects) if they can claim. */
#ifndef EMQ_WAKE_H
#define EMQ_WAKE_H

#include "emq_rm.h"

/* Jobs of the queue of <pending> may be claimable now (in <pending> or
 * <base>priority): wake the claims waiting on it. */
void emq_signal_claimable(RedisModuleCtx *ctx, RedisModuleString *pending);

/* A job of <pending> becomes claimable at due_ms (server clock; now_ms is
 * the caller's clock reading): now -> emq_signal_claimable(); later -> the
 * key's timer is brought forward to due_ms if claims wait on the key. */
void emq_signal_due(RedisModuleCtx *ctx, RedisModuleString *pending, long long due_ms, long long now_ms);

/* 1 when the caller may be blocked: not inside MULTI, a script, or any
 * context that denies blocking (there a claim answers as without BLOCK). */
int emq_may_block(RedisModuleCtx *ctx);

/* Block the caller on the lanes of <pending> for block_ms (0: no time limit).  The
 * server later calls `reply` (which answers and returns REDISMODULE_OK, or
 * returns REDISMODULE_ERR to keep waiting) and, at the time limit or on
 * CLIENT UNBLOCK, `timeout`.  next_due_ms (or -1) is the earliest future
 * due time in <base>delayed: the key's timer is armed for it. */
void emq_wait(RedisModuleCtx *ctx, RedisModuleString *pending, long long block_ms, long long next_due_ms,
              long long now_ms, RedisModuleCmdFunc reply, RedisModuleCmdFunc timeout);

/* From `reply` when it keeps waiting: arm the key's timer for next_due_ms
 * (or nothing for -1). */
void emq_wait_again(RedisModuleCtx *ctx, long long next_due_ms, long long now_ms);

/* Free what the registry holds (at unload; nothing waits then: the server
 * refuses to unload a module with blocked clients or timers). */
void emq_wake_unload(RedisModuleCtx *ctx);

#endif
