/* emq_keys.h -- a queue's keys: the checks on them, the names derived from
 * <base>, the caller's ACL on those, opening and reading, and the fence.
 *
 * A verb names its sets (<pending>, <active>, <dead>) as declared keys; the
 * job rows and the metric are derived from <base> ("<base>job:<id>",
 * "<base>metrics:failed").  Every set must be <base> + its name, or a verb
 * could write one queue's sets and another queue's rows; in cluster mode
 * <base> must carry a hash tag, or its derived keys could live in other
 * slots. */
#ifndef EMQ_KEYS_H
#define EMQ_KEYS_H

#include "emq_core.h"
#include "emq_effects.h"
#include "emq_rm.h"

/* -- checks (EMQ_OK or the error to answer) ------------------------------- */

/* keys[i] must be <base><suffix[i]> for each of the n keys, else `mismatch`. */
int emq_check_queue_keys(RedisModuleString **keys, const char *const *suffix, int n,
                         RedisModuleString *base, int mismatch);

/* In cluster mode <base> must have a hash tag. */
int emq_check_cluster_base(RedisModuleCtx *ctx, RedisModuleString *base);

/* Both, keys first: what every verb that derives keys from <base> runs
 * (SWEEP alone parses its counts in between, so it calls the two). */
int emq_check_queue(RedisModuleCtx *ctx, RedisModuleString **keys, const char *const *suffix, int n,
                    RedisModuleString *base, int mismatch);

/* -- names ---------------------------------------------------------------- */

/* A new string base + mid + tail (tail may be NULL); the caller frees it. */
RedisModuleString *emq_derived_key(RedisModuleCtx *ctx, RedisModuleString *base, const char *mid,
                                   RedisModuleString *tail);

/* -- opening and reading -------------------------------------------------- */

/* Open `name` (REDISMODULE_READ, or READ|WRITE) into k, or close it. */
void emq_key_open(RedisModuleCtx *ctx, EmqKey *k, RedisModuleString *name, int mode);
void emq_key_close(EmqKey *k);

/* 1 when the key is empty or holds `keytype`. */
int emq_type_ok(EmqKey *k, int keytype);

/* 1 when the key holds nothing. */
int emq_key_empty(EmqKey *k);

/* A field of a hash key as a new string (the caller frees it), or NULL when
 * the key or the field does not exist. */
RedisModuleString *emq_hget(EmqKey *k, RedisModuleString *field);

/* 1 when the hash key has the field. */
int emq_hexists(EmqKey *k, RedisModuleString *field);

/* The integer field of a hash key (missing counts as 0) plus `add`, with
 * HINCRBY's refusals; `not_integer` is the error for a non-integer. */
int emq_hash_incr(EmqKey *k, RedisModuleString *field, long long add, int not_integer,
                  long long *next);

/* Byte-for-byte equality. */
int emq_str_equal(RedisModuleString *a, RedisModuleString *b);

/* -- the fence ------------------------------------------------------------ */

/* Read the holder verdict for <id> and <token>: the row's `attempts` must
 * be byte-for-byte the token, and the id must still be in <active>.  When
 * the holder matches and attempts_out is given, it receives `attempts` as
 * an integer (-1 when it is not one). */
int emq_check_holder(EmqKey *active, EmqKey *row, RedisModuleString *id, RedisModuleString *token,
                     long long *attempts_out);

/* -- ACL on derived keys -------------------------------------------------- */

/* Redis checks the caller's ACL against the declared keys only; the rows
 * and the metric derived from <base> are checked here, before they are
 * read.  emq_acl_user() loads the caller once per command: 0 when the
 * caller is a user that does not exist (refuse), else 1, with *user NULL
 * when there is nothing to check (no client user, or a server without the
 * ACL API, which is logged at load).  emq_acl_may_touch() checks one key
 * for read and write; emq_acl_allows() loads, checks `n` keys (NULL entries
 * skipped) and frees.  The _to variants take what the verb does to the
 * keys, as key-spec flags, so that the check asks exactly the permission a
 * core command doing the same would need (its key spec's flags):
 *   EMQ_DERIVED_READ_WRITE  read, then changed or created, as HINCRBY does:
 *                           the rows and the metric of SWEEP, CLAIM, FAIL,
 *                           CANCEL (what the plain functions check);
 *   EMQ_DERIVED_CREATE      created only when absent, never read, as SETNX:
 *                           ENQUEUE's row (a %W~ user may enqueue). */
#define EMQ_DERIVED_READ_WRITE ((int)(REDISMODULE_CMD_KEY_ACCESS | REDISMODULE_CMD_KEY_UPDATE))
#define EMQ_DERIVED_CREATE ((int)REDISMODULE_CMD_KEY_INSERT)
int emq_acl_user(RedisModuleCtx *ctx, RedisModuleUser **user);
int emq_acl_may_touch(RedisModuleUser *user, RedisModuleString *key);
int emq_acl_may_touch_to(RedisModuleUser *user, RedisModuleString *key, int flags);
int emq_acl_allows(RedisModuleCtx *ctx, RedisModuleString *const *names, size_t n);
int emq_acl_allows_to(RedisModuleCtx *ctx, RedisModuleString *const *names, size_t n, int flags);

#endif
