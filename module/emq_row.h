/* emq_row.h -- what a job row holds: the values kept in pieces, the level.
 *
 * A row holds only what its state needs (docs/reference/keyspace.md): an
 * enqueued job's row is `state`, `payload` and `enqueued_at`, plus
 * `priority` when it is not 0.  A value of 65 to 1024 bytes (`payload`,
 * `result`) is stored in pieces of at most 64 bytes -- `payload`,
 * `payload:1`, ... -- so that the row stays a listpack: a hash is one only
 * while every value fits hash-max-listpack-value (64 bytes by default), and
 * a single 76-byte payload made the whole row a hashtable (bench/memory.py
 * measures the difference).  Every reader joins the pieces; every writer
 * that replaces a value deletes the pieces it no longer needs. */
#ifndef EMQ_ROW_H
#define EMQ_ROW_H

#include "emq_effects.h"
#include "emq_rm.h"

/* The values stored in pieces. */
typedef enum { EMQ_VALUE_PAYLOAD, EMQ_VALUE_RESULT, EMQ_VALUES } EmqValue;

/* The field names of `which`: [0] is the value's own ("payload"), [i] its
 * i-th piece ("payload:i"); made at load (emq.c). */
extern RedisModuleString *emq_piece_name[EMQ_VALUES][16];

/* The fields that store `value` as `which`: fills fields[] and values[]
 * (room for EMQ_MAX_PIECES each; the piece strings live until
 * emq_fx_commit) for the caller's HSET, and returns how many. */
int emq_row_pieces(EmqFx *fx, int which, RedisModuleString *value, RedisModuleString **fields,
                   RedisModuleString **values);

/* Delete the row's pieces of `which` from piece `keep` on (HDEL each), so
 * that a value written in `keep` fields does not inherit a longer one's
 * tail.  Reads nothing when the stored value cannot have pieces. */
void emq_row_drop_pieces(EmqFx *fx, EmqKey *row, int which, int keep);

/* The value of `which` with its pieces joined, as a new string (the caller
 * frees it), or NULL when the row has no such field. */
RedisModuleString *emq_row_value(EmqKey *row, int which);

/* The row's `priority` (absent: 0), or EMQ_ERR_PRIORITY_FIELD. */
int emq_row_level(EmqKey *row, long long *level);

#endif
