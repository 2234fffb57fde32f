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

/* <base> as a new string, from a key that is <base> + `suffix` (the caller
 * checked that it is); the caller frees it. */
RedisModuleString *emq_base_of(RedisModuleCtx *ctx, RedisModuleString *key, const char *suffix);

/* -- opening and reading -------------------------------------------------- */

/* Open `name` (REDISMODULE_READ, or READ|WRITE) into k, or close it;
 * closing signals the key as modified when a write changed it. */
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

/* Up to `limit` members of a sorted set scored at or below `max`, lowest
 * first, copied out into *ids (a new array; the caller frees each string
 * and the array with RedisModule_Free).  Returns how many.  A range
 * iterator must be closed before its set is written: the operator verbs
 * collect first, then check, then write. */
size_t emq_zset_head(EmqKey *set, double max, long long limit, RedisModuleString ***ids);

/* -- keys derived from <base> ---------------------------------------------- */

/* Open a key derived from <base>: the caller's ACL first, before anything
 * is read (a refusal must not reveal what the key holds); then, when the
 * key is absent on a cluster node, whether it is absent for good or on its
 * way between nodes (a slot migration: EMQ_ERR_TRYAGAIN, and the verb writes
 * nothing -- it would otherwise create a second copy of a row that moved).
 * `access` is what the verb does to it (EMQ_DERIVED_*, below); the key is
 * opened for writing unless it is only read.  Returns EMQ_OK or the error;
 * k is open (or NULL-keyed on an ACL refusal) either way and must be
 * closed. */
int emq_open_derived(RedisModuleCtx *ctx, RedisModuleUser *user, EmqKey *k, RedisModuleString *name,
                     int access);

/* 1 when `name` is served by this node as it stands: always outside a
 * cluster; in one, 0 while the key's slot is migrating away with the key
 * already gone, or importing (the server's own routing rule, asked through
 * a context without the caller's ASKING flag).  Only asked for a key that
 * is absent, so the common path costs nothing. */
int emq_absent_key_is_final(RedisModuleCtx *ctx, RedisModuleString *name);

/* Whether the server's own routing has just vouched for the slot of the
 * command's `n` declared keys (distinct names, one slot): a plain call (not
 * from a script, a MULTI, the master's stream or a load) that the server
 * dispatched although one of them is absent here.  The server answers ASK or
 * TRYAGAIN for a missing key of a migrating slot, and MOVED or TRYAGAIN (two
 * keys or more, one missing) for an importing one, so the slot is neither:
 * every derived key of that slot is then final where absent, and
 * emq_absent_key_is_final() needs no probe (an idle claim on a cluster
 * otherwise sent one EXISTS per absent derived key).  Begin returns the
 * previous state, which emq_slot_vouched_end() restores. */
int emq_slot_vouched_begin(RedisModuleCtx *ctx, RedisModuleString **keys, int n);
void emq_slot_vouched_end(int previous);

/* Open a job row that the verb reads and then changes: the caller's ACL
 * user is loaded into *user (emq_acl_user), the row opened with
 * emq_open_derived(EMQ_DERIVED_READ_WRITE), and an existing row must be a
 * hash.  EMQ_OK or the error; the row must be closed either way. */
int emq_open_row(RedisModuleCtx *ctx, RedisModuleUser **user, EmqKey *row, RedisModuleString *name);

/* Free what emq_absent_key_is_final() made (at unload). */
void emq_keys_unload(void);

/* The queue's settings, from <base>meta (absent fields: the defaults). */
typedef struct {
    int paused;
    int deps; /* `deps`: the queue has had a dependency (ENQUEUE ... AFTER) */
    long long done_ttl, cancelled_ttl, dead_ttl;
} EmqMeta;

/* Read <base>meta (ACL-checked for reading).  EMQ_OK or the error. */
int emq_read_meta(RedisModuleCtx *ctx, RedisModuleUser *user, RedisModuleString *base, EmqMeta *meta);

/* -- the fence ------------------------------------------------------------ */

/* Read the holder verdict for <id> and <token>: the row's `token` must be
 * byte-for-byte the caller's, and the id must still be in <active>. */
int emq_check_holder(EmqKey *active, EmqKey *row, RedisModuleString *id, RedisModuleString *token);

/* The holder verdict, and whether the call is the retry of `verb` whose
 * reply was lost (emq_core's emq_is_retry_of, with the row's `closed_by`);
 * for a retry, *route is where the first call sent the job
 * (emq_closed_route). */
int emq_check_holder_or_retry(EmqKey *active, EmqKey *row, RedisModuleString *id,
                              RedisModuleString *token, int verb, int *retry, int *route);

/* -- ACL on derived keys -------------------------------------------------- */

/* Redis checks the caller's ACL against the declared keys only; the rows,
 * the settings, the metric and the request records derived from <base> are
 * checked here, before they are read (emq_open_derived does it).
 * emq_acl_user() loads the caller once per command: 0 when the caller is a
 * user that does not exist (refuse), else 1, with *user NULL when there is
 * nothing to check (no client user, or a server without the ACL API, which
 * is logged at load).
 *
 * emq_acl_may() asks whether the caller could do to the key, with core
 * commands, what the verb does to it: the server's own check of those
 * commands (RedisModule_ACLCheckCommandPermissions), which takes the
 * selectors one by one and wants one that allows both the command and the
 * key with the access the command needs.  (ACLCheckKeyPermissions asks
 * whether ANY selector has the key, whatever commands that selector allows:
 * a user whose second selector is `(~<base>job:* +@read)` may not HINCRBY a
 * row, yet passed that check.)  The access is a set of:
 *   EMQ_DERIVED_READ    read its fields:         HGET <key> (GET for a string)
 *   EMQ_DERIVED_WRITE   create or change it:     HSET <key> (SET for a string)
 *   EMQ_DERIVED_DELETE  delete it:               DEL <key>
 *   EMQ_DERIVED_STRING  the key is a string (a request record)
 *   EMQ_DERIVED_ZSET    the key is a sorted set (<base>priority, <base>delayed):
 *                       read is ZSCORE, create or change ZADD
 * and the usual ones are named:
 *   EMQ_DERIVED_READ_WRITE  the rows and the metric a verb reads and changes
 *                           (SWEEP, CLAIM, FAIL, CANCEL, RELEASE, RETRY...);
 *   EMQ_DERIVED_CREATE      ENQUEUE's row, made only when absent (a %W~ user
 *                           may enqueue, as it may HSET);
 *   EMQ_DERIVED_RECORD      a claim's request record, read and written (GET,
 *                           SET);
 *   EMQ_DERIVED_RECORD_CREATE  an enqueue's request record, created when
 *                           absent as SET NX would (SET);
 *   EMQ_DERIVED_READ_DELETE a row read, then deleted (PURGE, FORGET).
 * What the key is also given (PEXPIREAT and PERSIST of a finished row, the
 * DEL of a retention of 0, HDEL, HINCRBY) is not asked separately: a user
 * allowed HSET on a row but denied one of those by name is not told apart
 * (docs/reference/acl.md). */
#define EMQ_DERIVED_READ 1
#define EMQ_DERIVED_WRITE 2
#define EMQ_DERIVED_DELETE 4
#define EMQ_DERIVED_STRING 8
#define EMQ_DERIVED_ZSET 16
#define EMQ_DERIVED_READ_WRITE (EMQ_DERIVED_READ | EMQ_DERIVED_WRITE)
#define EMQ_DERIVED_CREATE EMQ_DERIVED_WRITE
#define EMQ_DERIVED_RECORD (EMQ_DERIVED_READ | EMQ_DERIVED_WRITE | EMQ_DERIVED_STRING)
#define EMQ_DERIVED_RECORD_CREATE (EMQ_DERIVED_WRITE | EMQ_DERIVED_STRING)
#define EMQ_DERIVED_READ_DELETE (EMQ_DERIVED_READ | EMQ_DERIVED_DELETE)
#define EMQ_DERIVED_LANE (EMQ_DERIVED_READ | EMQ_DERIVED_WRITE | EMQ_DERIVED_ZSET)
int emq_acl_user(RedisModuleCtx *ctx, RedisModuleUser **user);
int emq_acl_may(RedisModuleUser *user, RedisModuleString *key, int access);

#endif
