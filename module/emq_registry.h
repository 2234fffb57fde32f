/* emq_registry.h -- the queue registry (issue 44): every queue that ever had a job is found.
 *
 * The record of truth is a marker in the queue's own slot, `<base>queue`, the
 * string "1": ENQUEUE and ENQUEUEMANY create it when absent (as SET NX would:
 * only its existence is read), looked up only when <pending> is empty, and
 * the OBLITERATE step that empties the queue deletes it.  It
 * is written in the enqueue's own atomic step, in its slot, so it is the same
 * on a standalone server and in a Redis Cluster, whatever the client.
 *
 * The index readers use without a keyspace SCAN is the set `emq:queues`, kept
 * by the clients (echomq/_protocol/registry.py): a verb never writes it, as
 * it is one key in one slot that a verb of another slot may not write in a
 * cluster, and no key a verb's key specs do not declare is written.  Readers
 * fill it from the markers once (docs/concepts/registry.md). */
#ifndef EMQ_REGISTRY_H
#define EMQ_REGISTRY_H

#include "emq_effects.h"
#include "emq_rm.h"

typedef struct {
    RedisModuleCtx *ctx;
    RedisModuleString *name; /* owned */
    EmqKey key;
} EmqRegistry;

/* Ready to open (and to close). */
void emq_registry_init(EmqRegistry *g, RedisModuleCtx *ctx);

/* Open <base>queue (the caller's ACL: SET) when <pending>, open, is empty:
 * the queue's first enqueue, or the first since its default lane drained.
 * An enqueue into a non-empty lane neither reads nor writes the marker (the
 * enqueue that made the lane non-empty saw to it): the busy path costs
 * nothing.  EMQ_OK or the error. */
int emq_registry_open(EmqRegistry *g, RedisModuleUser *user, RedisModuleString *base, EmqKey *pending);

/* SET <base>queue 1 when it was opened and does not exist. */
void emq_registry_mark(EmqRegistry *g, EmqFx *fx);

void emq_registry_close(EmqRegistry *g);

/* The marker's name, <base>queue, as a new string (OBLITERATE deletes it). */
RedisModuleString *emq_registry_name(RedisModuleCtx *ctx, RedisModuleString *base);

#endif
