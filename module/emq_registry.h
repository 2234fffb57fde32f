/* emq_registry.h -- the queue registry (issue 30): every queue that ever had a job is found.
 *
 * A queue is registered by a marker in its own slot, `<base>queue`, a string
 * holding the server ms of its first enqueue: ENQUEUE and ENQUEUEMANY
 * create it when absent (as SET NX would: only its existence is read), and
 * the OBLITERATE step that empties the queue deletes it.  A set of queue
 * names beside the queues would be one key outside every queue's slot,
 * which a verb of one queue may not write in a Redis Cluster; the marker is
 * the same on a standalone server and in a cluster.  Readers find the
 * markers with SCAN ... MATCH emq:{*}:queue TYPE string, node by node
 * (client.queues(), the metrics exporter): a queue that drained between two
 * scans is still found. */
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

/* Open <base>queue (the caller's ACL: SET).  EMQ_OK or the error. */
int emq_registry_open(EmqRegistry *g, RedisModuleUser *user, RedisModuleString *base);

/* SET <base>queue <now> when it does not exist. */
void emq_registry_mark(EmqRegistry *g, EmqFx *fx, long long now);

void emq_registry_close(EmqRegistry *g);

/* The marker's name, <base>queue, as a new string (OBLITERATE deletes it). */
RedisModuleString *emq_registry_name(RedisModuleCtx *ctx, RedisModuleString *base);

#endif
