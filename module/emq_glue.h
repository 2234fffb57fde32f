/* emq_glue.h -- small helpers shared by the command files. */
#ifndef EMQ_GLUE_H
#define EMQ_GLUE_H

#include "emq_rm.h"

/* Byte-for-byte equality of two strings. */
int emq_str_equal(RedisModuleString *a, RedisModuleString *b);

/* 1 when the key is empty or holds `keytype`. */
int emq_type_ok(RedisModuleKey *key, int keytype);

/* A new string base + mid + tail (tail may be NULL with taillen 0); the
 * caller frees it. */
RedisModuleString *emq_derived_key(RedisModuleCtx *ctx, RedisModuleString *base, const char *mid,
                                   RedisModuleString *tail);

/* The job rows and the metric are derived from <base>, so every key a
 * command takes must be <base> followed by its name, or a command could
 * write one queue's sets and another queue's rows.  NULL when keys[i] is
 * <base><suffix[i]> for each of the n keys, else `mismatch` (the command's
 * own error reply naming its keys). */
const char *emq_check_queue_keys(RedisModuleString **keys, const char *const *suffix, int n,
                                 RedisModuleString *base, const char *mismatch);

/* NULL, or the error reply when the server is in cluster mode and <base> has
 * no hash tag: its derived keys could then live in other slots. */
const char *emq_check_cluster_base(RedisModuleCtx *ctx, RedisModuleString *base);

/* Both checks, keys first: what every command deriving keys from <base>
 * runs (SWEEP alone parses its counts in between, so it calls the two).
 * emq_check_pending_queue() is the case of ENQUEUE and CANCEL, whose only
 * set is <pending>. */
const char *emq_check_queue(RedisModuleCtx *ctx, RedisModuleString **keys, const char *const *suffix,
                            int n, RedisModuleString *base, const char *mismatch);
const char *emq_check_pending_queue(RedisModuleCtx *ctx, RedisModuleString *pending,
                                    RedisModuleString *base);

/* Redis checks the caller's ACL against the declared key arguments only;
 * the rows and the metric derived from <base> are checked here.
 * emq_acl_user() loads the caller once per command: it returns 0 when the
 * caller is a user that does not exist (refuse), else 1, with *user set to
 * NULL when there is nothing to check (no client user, or a server without
 * the ACL API, which is logged at load time).  emq_acl_may_touch() checks
 * one key for read and write; emq_acl_allows() loads, checks `n` keys (NULL
 * entries skipped) and frees. */
int emq_acl_user(RedisModuleCtx *ctx, RedisModuleUser **user);
int emq_acl_may_touch(RedisModuleUser *user, RedisModuleString *key);
int emq_acl_allows(RedisModuleCtx *ctx, RedisModuleString *const *names, size_t n);

/* The value of an integer field of an open hash (missing counts as 0) plus
 * `by`, with HINCRBY's refusals; `incr` is an emq_core function. */
typedef const char *(*emq_incr_fn)(const char *cur, size_t len, int present, long long *next);
const char *emq_hash_incr(RedisModuleCtx *ctx, RedisModuleKey *key, const char *field,
                          emq_incr_fn incr, long long *next);

/* Who holds the job?  The token fence: the row's `attempts` must be
 * byte-for-byte the token, and the id must still be in the active set.
 * When attempts_out is given and the holder matches, it receives attempts
 * as an integer (-1 when it is not one). */
typedef enum {
    EMQ_HOLDER_OK,
    EMQ_HOLDER_GONE,
    EMQ_HOLDER_STALE_TOKEN,
    EMQ_HOLDER_NOT_ACTIVE
} EmqHolder;
EmqHolder emq_check_holder(RedisModuleCtx *ctx, RedisModuleKey *active, RedisModuleKey *row,
                           RedisModuleString *id, RedisModuleString *token, long long *attempts_out);

/* 1 when the open row carries a `cancel_requested` field. */
int emq_has_cancel_request(RedisModuleKey *row);

/* Writes that fire the keyspace events of the core command they stand for
 * (the low-level key API fires none): ZREM fires "zrem", and "del" when it
 * emptied the set; ZADD fires "zadd" only when it added or moved the member;
 * HSET fires "hset". */
void emq_zrem(RedisModuleCtx *ctx, RedisModuleKey *set, RedisModuleString *set_name,
              RedisModuleString *id);
void emq_zadd(RedisModuleCtx *ctx, RedisModuleKey *set, RedisModuleString *set_name, double score,
              RedisModuleString *id);
void emq_notify_hset(RedisModuleCtx *ctx, RedisModuleString *row_name);

/* A new string holding the decimal value. */
RedisModuleString *emq_ll_string(RedisModuleCtx *ctx, long long v);

#define EMQ_ERR_THREE_SETS \
    "ERR <active>, <pending> and <dead> must be <base>active, <base>pending and <base>dead"

#define EMQ_NOPERM_DERIVED \
    "NOPERM this user has no permissions to access the job rows or metrics derived from <base>"

#endif
