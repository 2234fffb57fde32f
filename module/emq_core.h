/* emq_core.h -- every decision of the EMQ.* verbs that needs no server.
 *
 * Nothing here includes the module API: these functions take bytes and
 * numbers and return verdicts, so the tests call them in-process (cffi, on
 * emq.so itself) and the command files stay a thin layer of parse, open,
 * read, decide, apply.
 *
 * Errors are one enum with one table of texts (emq_error_text): a function
 * that can refuse returns EMQ_OK or the error to answer.  Enums cross the
 * exported functions as plain ints, so cffi needs no declarations of its
 * own. */
#ifndef EMQ_CORE_H
#define EMQ_CORE_H

#include <stddef.h>
#include <stdint.h>

/* emq.so is built with hidden visibility; only the module entry points and
 * these functions are exported (the tests call them through cffi). */
#define EMQ_EXPORT __attribute__((visibility("default")))

/* The largest integer a double holds exactly, and so the latest deadline a
 * sorted-set score can carry without rounding: 2^53 ms is year 287396. */
#define EMQ_MAX_EXACT_SCORE 9007199254740992LL

/* The largest checkpoint state stored by default (emq.max-state-bytes). */
#define EMQ_DEFAULT_MAX_STATE_BYTES 65536

/* The most jobs one CLAIM hands out (COUNT above it claims this many, or
 * emq.max-limit's value when that is lower). */
#define EMQ_MAX_CLAIM_COUNT 1000

/* The highest emq.max-limit a server may set: every verb that takes a count
 * or a list (SWEEP, ENQUEUEMANY, RETRYDEAD, PURGE, OBLITERATE, FORGET) is
 * run at this many jobs by the test suite, under the memory checker too
 * (tests/verbs/test_limits.py).  About 0.25 s of one SWEEP at the rate
 * bench/RESULTS.md measured: a stall clients survive, and 10 times the
 * default. */
#define EMQ_MAX_LIMIT_CEILING 100000

/* The largest job payload ENQUEUE and ENQUEUEMANY take by default
 * (emq.max-payload-bytes), and the largest result COMPLETE and
 * COMPLETECLAIM store by default (emq.max-result-bytes): 1 MiB.  A job's
 * data belongs in the queue while it is small; a larger one belongs in a
 * store the payload names.  Both may be raised to 16 MiB, the ceiling the
 * suite runs them at. */
#define EMQ_DEFAULT_MAX_PAYLOAD_BYTES (1024LL * 1024)
#define EMQ_DEFAULT_MAX_RESULT_BYTES (1024LL * 1024)
#define EMQ_MAX_PAYLOAD_BYTES_CEILING (16LL * 1024 * 1024)
#define EMQ_MAX_RESULT_BYTES_CEILING (16LL * 1024 * 1024)

/* The largest traceback FAIL ... TRACE stores: 64 KiB.  The client cuts a
 * traceback to its newest 8 KiB; this bounds what any other caller may
 * leave on a row, fixed rather than a setting. */
#define EMQ_MAX_TRACE_BYTES 65536

/* The highest emq.max-state-bytes: 16 MiB.  A state is a job's progress,
 * not its data, and a CLAIM hands back up to EMQ_MAX_CLAIM_COUNT of them in
 * one reply; the suite stores and hands back a state of this size. */
#define EMQ_MAX_STATE_BYTES_CEILING (16LL * 1024 * 1024)

/* Every error a verb answers, in one place; the texts are in emq_core.c. */
typedef enum {
    EMQ_OK = 0,
    /* arguments */
    EMQ_ERR_LEASE_NOT_INTEGER,
    EMQ_ERR_LEASE_TOO_SMALL,
    EMQ_ERR_LEASE_TOO_LARGE,
    EMQ_ERR_MAX_STALLED,
    EMQ_ERR_LIMIT,
    EMQ_ERR_MAX_ATTEMPTS,
    EMQ_ERR_CLAIM_COUNT,
    EMQ_ERR_LIMIT_TOO_LARGE, /* above the server's emq.max-limit (emq_config.h) */
    EMQ_ERR_DELAY,
    EMQ_ERR_DELAY_TOO_LARGE,
    EMQ_ERR_AT,
    EMQ_ERR_AT_TOO_LARGE,
    EMQ_ERR_DELAY_AND_AT,
    EMQ_ERR_BLOCK,
    EMQ_ERR_BLOCK_TOO_LARGE,
    EMQ_ERR_MANY_COUNT,
    EMQ_ERR_MANY_TOO_MANY,
    EMQ_ERR_MANY_DUPLICATE,
    EMQ_ERR_FORGET_TOO_MANY,
    /* keys */
    EMQ_ERR_SAME_KEY,
    EMQ_ERR_THREE_SETS,
    EMQ_ERR_PENDING_KEY,
    EMQ_ERR_PENDING_ACTIVE_KEYS,
    EMQ_ERR_PENDING_ACTIVE_ORDER,
    EMQ_ERR_NO_HASH_TAG,
    EMQ_ERR_WRONGTYPE,
    EMQ_ERR_NOPERM_DERIVED,
    /* rows and counters */
    EMQ_ERR_STALLED_NOT_INTEGER,
    EMQ_ERR_ATTEMPTS_NOT_INTEGER,
    EMQ_ERR_TRIES_NOT_INTEGER,
    EMQ_ERR_FAILED_NOT_INTEGER,
    EMQ_ERR_OVERFLOW,
    /* the fence and the job's identity */
    EMQ_ERR_STALE_EXTEND,
    EMQ_ERR_STALE_COMPLETE,
    EMQ_ERR_STALE_FAIL,
    EMQ_ERR_STALE_RELEASE,
    EMQ_ERR_NOT_ACTIVE,
    EMQ_ERR_EXISTS,
    EMQ_ERR_JOB_KEY,
    /* the queue's settings, and its keys on the move */
    EMQ_ERR_META_NOT_INTEGER,
    EMQ_ERR_TRYAGAIN,
    EMQ_ERR_SYNTAX,
    EMQ_ERR_REQ_EMPTY,
    EMQ_ERR_REQ_RECORD,
    EMQ_ERR_STATE_TOO_LARGE,
    EMQ_ERR_OOM,
    /* the operator verbs (emq_dead.c, emq_admin.c) */
    EMQ_ERR_RETENTION_VALUE,
    EMQ_ERR_DEAD_PENDING_KEYS,
    EMQ_ERR_DEAD_KEY,
    EMQ_ERR_UNTIL,
    EMQ_ERR_RETRIES_NOT_INTEGER,
    EMQ_ERR_STATE_PENDING,
    EMQ_ERR_STATE_ACTIVE,
    EMQ_ERR_STATE_DONE,
    EMQ_ERR_STATE_UNKNOWN,
    EMQ_ERR_BUSY,
    /* the v3 keyspace: priorities, ceilings on what a row holds (issues 29, 30, 31) */
    EMQ_ERR_PRIORITY,
    EMQ_ERR_PRIORITY_FIELD,
    EMQ_ERR_PAYLOAD_TOO_LARGE,
    EMQ_ERR_RESULT_TOO_LARGE,
    EMQ_ERR_TRACE_TOO_LARGE,
    EMQ_ERR_PROGRESS_TOO_LARGE,
    /* flow control (issue 32, emq_flow.c) */
    EMQ_ERR_RATE_MAX,
    EMQ_ERR_RATE_PER,
    EMQ_ERR_BACKOFF,
    EMQ_ERR_LIMIT_FIELD,
    /* unique jobs (issue 31, emq_unique.c) */
    EMQ_ERR_UNIQUE_KEY,
    EMQ_ERR_UNIQUE_FOR,
    EMQ_ERR_UNIQUE_UNTIL,
    EMQ_ERR_UNIQUE_FOR_AND_UNTIL,
    EMQ_ERR_UNIQUE_NEEDED,
    EMQ_ERR_UNIQUE_MANY,
    /* groups (issue 45, emq_group.c) */
    EMQ_ERR_GROUP,
    EMQ_ERR_GROUP_FIELD,
    /* dependencies (emq_deps.h) */
    EMQ_ERR_AFTER_TOO_MANY,
    EMQ_ERR_AFTER_EMPTY_ID,
    EMQ_ERR_AFTER_SELF,
    EMQ_ERR_AFTER_POLICY,
    EMQ_ERR_AFTER_MISSING,
    EMQ_ERR_AFTER_NEEDED,
    EMQ_ERR_AFTER_MANY,
    EMQ_ERR_AFTER_FIELD,
    EMQ_ERR_GROUP_MAX,
    EMQ_ERR_GROUP_MAX_FIELD,
    EMQ_ERR_GROUP_DEFAULT_FIELD,
    EMQ_ERR_GROUP_WALK,
    EMQ_ERR_COUNT_ /* not an error: the size of the table */
} EmqError;

/* The reply text of an error ("ERR ...", "EMQSTALE ...": no leading '-'). */
EMQ_EXPORT const char *emq_error_text(int err);

/* -- numbers ------------------------------------------------------------ */

/* Parse a canonical base-10 signed 64-bit integer: an optional '-', then
 * digits, no leading zeros, no '+', no spaces, no overflow (the same strings
 * Redis itself accepts as integers).  Returns 0 and sets *out, or -1. */
EMQ_EXPORT int emq_parse_ll(const char *s, size_t len, long long *out);

/* <lease-ms>: an integer >= 1 whose deadline now_ms + lease is still an
 * exact integer score.  Sets *deadline_ms on EMQ_OK. */
EMQ_EXPORT int emq_lease_deadline(long long now_ms, const char *s, size_t len, long long *deadline_ms);

/* Which count argument is parsed: it names itself in the error. */
typedef enum { EMQ_COUNT_MAX_STALLED, EMQ_COUNT_LIMIT, EMQ_COUNT_MAX_ATTEMPTS, EMQ_COUNT_CLAIM } EmqCountArg;

/* A count argument: an integer >= 1.  `which` is an EmqCountArg. */
EMQ_EXPORT int emq_parse_count(int which, const char *s, size_t len, long long *out);

/* When a job becomes claimable, on the server clock: its <pending> score.
 * DELAY <ms>: an integer >= 0, due at now_ms + ms; AT <unix-ms>: an integer
 * >= 0, due then, or now_ms when that is already past.  Either way the due
 * time must be an exact score (at most 2^53).  Sets *due_ms on EMQ_OK. */
EMQ_EXPORT int emq_due_after_delay(long long now_ms, const char *s, size_t len, long long *due_ms);
EMQ_EXPORT int emq_due_at(long long now_ms, const char *s, size_t len, long long *due_ms);

/* BLOCK <ms> of a claim: an integer >= 0 (0 waits forever) with now_ms + ms
 * at most 2^53.  Sets *block_ms on EMQ_OK. */
EMQ_EXPORT int emq_parse_block(long long now_ms, const char *s, size_t len, long long *block_ms);

/* <count> of ENQUEUEMANY: an integer from 1 to `max` (the server's
 * emq.max-limit; a larger count is refused, not clamped: it says where the
 * options start). */
EMQ_EXPORT int emq_parse_many_count(const char *s, size_t len, long long max, long long *out);

/* <limit> of SWEEP, RETRYDEAD, PURGE and OBLITERATE: an integer from 1 to
 * `max` (the server's emq.max-limit): EMQ_ERR_LIMIT, then
 * EMQ_ERR_LIMIT_TOO_LARGE. */
EMQ_EXPORT int emq_parse_limit(const char *s, size_t len, long long max, long long *out);

/* 1 when `argc` arguments hold `count` groups of `per` arguments from
 * index `from` on (from + per * count <= argc), computed without overflow
 * for any count: a count read from the client is checked against the
 * arguments before it sizes anything. */
EMQ_EXPORT int emq_count_fits(long long count, int per, int from, int argc);

/* -1 when the n byte strings (items[i], lens[i]) are all different, else
 * the index of one that equals another.  `order` is scratch room for n
 * longs; O(n log n), no allocation. */
EMQ_EXPORT long emq_first_duplicate(const char *const *items, const size_t *lens, long n, long *order);

/* The value of an integer row field or counter after adding `add`, as
 * HINCRBY computes it: a missing field counts as 0; a field that is not an
 * integer is `not_integer`; an overflow is EMQ_ERR_OVERFLOW. */
EMQ_EXPORT int emq_incr(const char *cur, size_t len, int present, long long add, int not_integer,
                        long long *next);

/* The three counters the verbs keep, each with its own refusal. */
EMQ_EXPORT int emq_next_stalled(const char *cur, size_t len, int present, long long *next);
EMQ_EXPORT int emq_next_attempts(const char *cur, size_t len, int present, long long *next);
EMQ_EXPORT int emq_add_failed(const char *cur, size_t len, int present, long long deaths,
                              long long *next);

/* -- keys --------------------------------------------------------------- */

/* 1 when key is exactly base followed by suffix, else 0. */
EMQ_EXPORT int emq_key_is(const char *key, size_t keylen, const char *base, size_t baselen,
                          const char *suffix);

/* 1 when every key that starts with `base` hashes to the slot of base's own
 * hash tag: base has a '{' followed later in base by a '}' with at least one
 * byte between.  Without that, base + "job:" + id could hash anywhere (an id
 * may even supply the closing brace). */
EMQ_EXPORT int emq_base_has_hash_tag(const char *base, size_t len);

/* 1 when <job> is <base>job:<id> for the <base> of <active> (<active> is
 * <base>active): a holder may act on its own job only, whatever token it
 * has. */
EMQ_EXPORT int emq_job_key_matches(const char *active, size_t activelen, const char *job, size_t joblen,
                                   const char *id, size_t idlen);

/* 1 when the argument is the option `name` (ASCII case-insensitive, as
 * Redis reads its own options). */
EMQ_EXPORT int emq_option_is(const char *arg, size_t len, const char *name);

/* -- request records ---------------------------------------------------- */

/* A call made with REQ <request-id> is remembered in a string key,
 * <base>req:<request-id>, so that a retry of the same call (its reply was
 * lost) is answered as the first call was instead of taking effect again.
 * A request id names one call; a record is read only by a retry of it.
 *
 * A claim's record (CLAIM, COMPLETECLAIM) lists the jobs it took: the items
 * (id, token, id, token, ...) each as "<length>:<bytes>", kept as long as
 * the lease.  emq_record_item_size() is the room one item takes;
 * emq_record_put() writes it at out and returns its size; emq_record_next()
 * reads the item at *pos (1, and advances *pos), or says the record ended
 * (0) or is not one (-1). */
EMQ_EXPORT size_t emq_record_item_size(size_t len);
EMQ_EXPORT size_t emq_record_put(char *out, const char *item, size_t len);
EMQ_EXPORT int emq_record_next(const char *rec, size_t reclen, size_t *pos, const char **item,
                               size_t *len);

/* A claim's record read back, checked before anything is allocated for it:
 * at least one and at most EMQ_MAX_CLAIM_COUNT (id, token) pairs, every
 * item within the record, every token 1 to EMQ_TOKEN_MAX - 1 bytes (what a
 * claim hands out, emq_format_token, is shorter).  The scan stops
 * at the first item past that ceiling, so a forged record of any size costs
 * at most EMQ_MAX_CLAIM_COUNT pairs' reading.  EMQ_OK and *pairs, or
 * EMQ_ERR_REQ_RECORD. */
EMQ_EXPORT int emq_claim_record_check(const char *rec, size_t len, long *pairs);

/* An enqueue's record (ENQUEUE, ENQUEUEMANY) says that the call ran: its
 * existence is the answer to a retry (:<count>, nothing written), whatever
 * became of the jobs since -- done and deleted at a retention of 0, or
 * forgotten, the row says nothing any more.  Nothing is read from it, so
 * it cannot be malformed; its value is the call's count, for a reader.  It
 * lives EMQ_ENQUEUE_RECORD_TTL_MS: the Python client sends a call again only
 * within REQ_RETRY_WINDOW_S (30 s) of its first send
 * (python/echomq/_protocol.py), and the rest covers a resend still on its
 * way.  One short key per call, gone after a minute, instead of the request
 * id on every row for the row's whole life. */
#define EMQ_ENQUEUE_RECORD_TTL_MS 60000

/* The record an enqueue of `count` jobs leaves: its decimal, at out (room
 * for 24 bytes); returns the length. */
EMQ_EXPORT int emq_enqueue_record(long long count, char *out);

/* Any long long's decimal (LLONG_MIN too), at out (room for 24 bytes);
 * returns the length.  What snprintf("%lld") writes, at a tenth of its cost:
 * every effect a verb replicates with a number (a score, a time) formats one. */
EMQ_EXPORT int emq_format_ll(long long v, char *out);

/* -- tokens ------------------------------------------------------------- */

/* The fencing token of a claim: "<attempts>-<16 hex digits>" from the
 * row's new `attempts` (every claim of the job, never lowered) and 8 random
 * bytes.  The counter says which claim it is; the random part makes it
 * unique even when a failover lost the claims that came before it (a new
 * master that never saw claim N hands out another claim N, with another
 * random part).  Writes at most EMQ_TOKEN_MAX bytes; returns the length. */
#define EMQ_TOKEN_MAX 48
EMQ_EXPORT int emq_format_token(long long attempts, const unsigned char *random8, char *out);

/* -- transitions -------------------------------------------------------- */

/* The threshold: a job whose stall count reached max_stalled is dead. */
EMQ_EXPORT int emq_stall_is_dead(long long stalled, long long max_stalled);

/* Who holds the job?  The fence: the row's token must be byte-for-byte the
 * caller's, and the id must still be in the active set. */
typedef enum {
    EMQ_HOLDER_OK,
    EMQ_HOLDER_GONE,        /* no row, or a row without a token */
    EMQ_HOLDER_STALE_TOKEN, /* another claim's token */
    EMQ_HOLDER_NOT_ACTIVE   /* the token matches, but a sweep took the job */
} EmqHolder;

EMQ_EXPORT int emq_holder(int has_token, int token_matches, int is_active);

/* The verbs that are fenced, for the error a non-holder gets. */
typedef enum { EMQ_VERB_EXTEND, EMQ_VERB_COMPLETE, EMQ_VERB_FAIL, EMQ_VERB_RELEASE } EmqVerb;

/* The error for a holder verdict that is neither OK nor GONE (GONE answers
 * :-1, which is not an error). */
EMQ_EXPORT int emq_holder_error(int verb, int holder);

/* A retried COMPLETE, FAIL or RELEASE: the holder's verb already ended its
 * hold (its reply was lost) when the row still carries the holder's token,
 * the job is no longer active, and the row's `closed_by` names this verb
 * ("complete", or "fail:<where>" / "release:<where>" with where the job
 * went).  The retry then answers what the first call answered, writing
 * nothing -- also when the job has moved on since (a cancel of the pending
 * job, say), which is why the first answer is kept, not read off `state`. */
EMQ_EXPORT int emq_is_retry_of(int verb, int holder, const char *closed_by, size_t len);

/* Where the first call sent the job, from `closed_by` ("fail:dead" ->
 * EMQ_FAIL_TO_DEAD, ...); EMQ_FAIL_TO_PENDING when it does not say. */
EMQ_EXPORT int emq_closed_route(const char *closed_by, size_t len);

/* The name a verb leaves in `closed_by`. */
EMQ_EXPORT const char *emq_verb_name(int verb);

/* Where FAIL sends a job: a job whose cancel was requested ends cancelled
 * (not retried, not a failure); else it is dead at max_attempts claims, or
 * at once with FAIL's DEAD (the handler said retrying cannot help), and
 * back in pending below that. */
typedef enum { EMQ_FAIL_TO_PENDING, EMQ_FAIL_TO_DEAD, EMQ_FAIL_TO_CANCELLED } EmqFailRoute;

EMQ_EXPORT int emq_fail_route(long long attempts, long long max_attempts, int cancel_requested, int dead);

/* 1 when a row's `state` says the job is over: done, dead or cancelled. */
EMQ_EXPORT int emq_state_is_finished(const char *state, size_t len);

/* What CANCEL does to a job: nothing for an unknown id (:-1), cancel a
 * waiting job (its row says pending: in a lane or delayed) on the spot,
 * store the request for a held one, or nothing for a finished one. */
typedef enum { EMQ_CANCEL_GONE, EMQ_CANCEL_NOW, EMQ_CANCEL_REQUEST, EMQ_CANCEL_FINISHED } EmqCancel;

EMQ_EXPORT int emq_cancel_decide(int row_exists, int in_pending, int finished);

/* -- the v3 keyspace: lanes, priorities, tombstones, pieces --------------
 *
 * A claimable job waits in a lane: level 0 in <base>pending (a list), any
 * other level in <base>priority (a sorted set scored
 * (level + 1024) * 2^42 + seq); a job not yet due waits in <base>delayed
 * (scored with its due time) and enters its lane's tail when it comes due.
 * docs/reference/keyspace.md says why. */

/* PRIORITY <n>: smaller runs first; 0, the default, is the list. */
#define EMQ_PRIORITY_MIN (-1000)
#define EMQ_PRIORITY_MAX 1000

/* seq, a job's place within its level, stays below 2^42 so that every
 * score is an exact double: (1000 + 1024) * 2^42 + 2^42 < 2^53.  A job
 * entering a level's tail takes <base>meta's counter, from 2^32 up; a job
 * put back at a level's head takes one less than the level's first job,
 * below 2^32: the heads of a level always come before its tails. */
#define EMQ_SEQ_LIMIT 4398046511104LL
#define EMQ_SEQ_TAIL_FIRST 4294967296LL

/* The most due members of <base>delayed one call moves to their lanes, and
 * the most tombstones of <base>pending one claim drops: each call's work is
 * bounded whatever the queue holds. */
#define EMQ_PROMOTE_MAX 1000
#define EMQ_DROP_MAX 1000

/* PRIORITY's argument: an integer from EMQ_PRIORITY_MIN to EMQ_PRIORITY_MAX
 * (EMQ_ERR_PRIORITY). */
EMQ_EXPORT int emq_parse_priority(const char *s, size_t len, long long *out);

/* A row's `priority` field (absent: 0): the same range, else
 * EMQ_ERR_PRIORITY_FIELD. */
EMQ_EXPORT int emq_row_priority(const char *s, size_t len, int present, long long *out);

/* The score of a job at `level` with `seq` in <base>priority, and the level
 * a score is at. */
EMQ_EXPORT long long emq_priority_score(long long level, long long seq);
EMQ_EXPORT long long emq_priority_level(double score);

/* The seq of the next job entering a level's tail, after the counter's
 * `seq`: seq + 1; EMQ_SEQ_TAIL_FIRST when <base>priority is empty
 * (`lane_empty`: the counter restarts where no job can be overtaken), when
 * `seq` is below it (a counter of an older version), or past
 * EMQ_SEQ_LIMIT - 1 (a wrap: 2^42 - 2^32 tail entries while the lane never
 * emptied, docs/concepts/priorities.md says how long that takes). */
EMQ_EXPORT long long emq_next_seq(long long seq, int lane_empty);

/* The seq of the i-th (from 0) of the `n` jobs one call puts back at the
 * head of a level, given the seq of the level's first job (`first`, when
 * `has_first`): the n go before every job waiting at the level, in the
 * call's order, so that a later call's go before an earlier call's (as
 * LPUSH does at level 0).  One less than the first job, and below
 * EMQ_SEQ_TAIL_FIRST; never below 0 (reaching it takes 2^32 jobs put back
 * and waiting at one level at once: ties there go by id). */
EMQ_EXPORT long long emq_head_seq(long long first, int has_first, long n, long i);

/* <base>meta's counters, `stale` and `seq`: absent is 0; anything but a
 * canonical integer >= 0 is EMQ_ERR_META_NOT_INTEGER. */
EMQ_EXPORT int emq_parse_meta_counter(const char *s, size_t len, int present, long long *out);

/* A group's name (GROUP <g>): 1 to EMQ_GROUP_MAX bytes of letters, digits
 * and -_.:@ -- it is part of key names and of what the operators read, so
 * nothing that needs quoting; else EMQ_ERR_GROUP. */
#define EMQ_GROUP_MAX 128
EMQ_EXPORT int emq_parse_group(const char *s, size_t len);

/* <base>group:<g>'s `active`: absent is 0; anything but a canonical integer
 * from 0 to 2^53 is EMQ_ERR_GROUP_FIELD. */
EMQ_EXPORT int emq_parse_group_active(const char *s, size_t len, int present, long long *out);

/* A group's cap (EMQ.GROUPLIMIT ... MAX <n>): an integer from 1 to
 * EMQ_GROUP_CAP_MAX, else EMQ_ERR_GROUP_MAX.  The stored `max` of
 * <base>group:<g>: absent is no cap (EMQ_NO_CAP), anything but such an
 * integer is EMQ_ERR_GROUP_MAX_FIELD. */
#define EMQ_GROUP_CAP_MAX 1000000000LL
#define EMQ_NO_CAP 9223372036854775807LL
EMQ_EXPORT int emq_parse_group_max(const char *s, size_t len, long long *out);
EMQ_EXPORT int emq_parse_group_max_field(const char *s, size_t len, int present, long long *out);

/* Is a group in the ring of groups a claim rotates through?  Exactly when
 * its lane holds a due job, it is not paused and fewer than its cap of its
 * jobs are active (a group whose lane was emptied by a cancel may stay in
 * the ring until a claim meets it: `lane_has_job` is what a claim needs). */
EMQ_EXPORT int emq_group_claimable(int lane_has_job, int paused, long long active, long long cap);

/* Is an entry of <base>pending live, a job a claim may take?  Its row
 * exists and says pending, it has no priority (it waits in <base>priority
 * then), it is not delayed, and this claim has not taken its id already.
 * Anything else is a tombstone: dropped, and counted off `stale`. */
EMQ_EXPORT int emq_entry_live(int row_exists, int state_pending, int has_priority, int in_delayed, int taken);

/* Is a member of <base>priority live, a job a claim may take?  Its row
 * exists and says pending.  Anything else is dropped: it leaves
 * <base>priority unclaimed (a member with no row has nothing to run). */
EMQ_EXPORT int emq_member_live(int row_exists, int state_pending);

/* The next job of a claim: the head of <base>priority when its level is
 * below 0, else a live entry of <base>pending, else the head of
 * <base>priority. */
EMQ_EXPORT int emq_priority_goes_first(long long level);

/* A value longer than EMQ_PIECE_BYTES and at most EMQ_PIECED_MAX bytes is
 * stored in pieces of EMQ_PIECE_BYTES: `payload`, `payload:1`,
 * `payload:2`, ... (the same for `result`), so that the row stays a
 * listpack (a hash stays one only while every value is at most
 * hash-max-listpack-value, 64 bytes by default).  A longer value is stored
 * whole.  emq_pieces() is how many fields a value of `len` bytes takes
 * (1: stored whole). */
#define EMQ_PIECE_BYTES 64
#define EMQ_PIECED_MAX 1024
#define EMQ_MAX_PIECES (EMQ_PIECED_MAX / EMQ_PIECE_BYTES)
EMQ_EXPORT int emq_pieces(size_t len);

/* -- retention ---------------------------------------------------------- */

/* How long a finished row is kept, in ms: a non-negative number, or
 * EMQ_KEEP_FOREVER.  The defaults keep memory bounded for a queue that runs
 * forever: done rows an hour, cancelled rows a day; dead rows are kept until
 * an operator retries or purges them. */
#define EMQ_KEEP_FOREVER (-1LL)
#define EMQ_DEFAULT_DONE_TTL_MS 3600000LL
#define EMQ_DEFAULT_CANCELLED_TTL_MS 86400000LL
#define EMQ_DEFAULT_DEAD_TTL_MS EMQ_KEEP_FOREVER

/* What happens to a finished row now: keep it, expire it at *at_ms, or
 * delete it at once (a retention of 0). */
typedef enum { EMQ_RETAIN_KEEP, EMQ_RETAIN_EXPIRE, EMQ_RETAIN_DELETE } EmqRetain;

EMQ_EXPORT int emq_retain(long long now_ms, long long ttl_ms, long long *at_ms);

/* A retention value read from the queue's meta hash: -1 or a non-negative
 * integer whose expiry time stays an exact integer. */
EMQ_EXPORT int emq_parse_retention(const char *s, size_t len, long long *out);

/* -- the operator verbs (emq_dead.c, emq_admin.c) ----------------------- */

/* A retention given to EMQ.RETENTION: the same range as the meta hash's
 * (-1 = forever, 0 = delete at once, at most 2^53 ms), refused with
 * EMQ_ERR_RETENTION_VALUE. */
EMQ_EXPORT int emq_parse_retention_arg(const char *s, size_t len, long long *out);

/* The UNTIL <ms> option of RETRYDEAD and PURGE: any integer (server ms). */
EMQ_EXPORT int emq_parse_until(const char *s, size_t len, long long *out);

/* May RETRY move a row in this `state` (NULL: the row has none) back to
 * pending?  EMQ_OK for dead and cancelled, else the EMQSTATE error naming
 * the state. */
EMQ_EXPORT int emq_retry_check(const char *state, size_t len);

/* PURGE takes a member of <dead>: is its row deleted with it?  Yes when the
 * row says dead (or is already gone); a row in any other state is not the
 * dead job's (<dead> was wrong about it) and is kept. */
EMQ_EXPORT int emq_purge_deletes_row(int row_exists, const char *state, size_t len);

/* FORGET deletes a row only when it is finished and in no set: done or
 * cancelled (a dead row belongs to <dead>, which PURGE empties). */
EMQ_EXPORT int emq_forget_deletes_row(const char *state, size_t len);

/* -- flow control (emq_flow.c) ------------------------------------------ */

#define EMQ_RATE_MAX_MAX 1000000000LL /* RATE <max>: at most a billion a window */
#define EMQ_RATE_PER_MAX 86400000LL   /* PER <ms> and BACKOFF <ms>: at most a day */

/* EMQ.LIMIT's numbers: RATE <max> in [1, EMQ_RATE_MAX_MAX] (EMQ_ERR_RATE_MAX),
 * PER <ms> in [1, EMQ_RATE_PER_MAX] (EMQ_ERR_RATE_PER), BACKOFF <ms> in
 * [0, EMQ_RATE_PER_MAX] (EMQ_ERR_BACKOFF). */
EMQ_EXPORT int emq_parse_rate_max(const char *s, size_t len, long long *out);
EMQ_EXPORT int emq_parse_rate_per(const char *s, size_t len, long long *out);
EMQ_EXPORT int emq_parse_backoff(const char *s, size_t len, long long *out);

/* A field of <base>limit as stored: absent is 0; else a canonical integer
 * from `min` to `max`, or EMQ_ERR_LIMIT_FIELD. */
EMQ_EXPORT int emq_parse_limit_field(const char *s, size_t len, int present, long long min, long long max,
                                     long long *out);

/* The fixed window `now` falls in: [*start, *start + per), aligned to the
 * server clock (start a multiple of per). */
EMQ_EXPORT void emq_rate_window(long long now, long long per, long long *start);

/* How many jobs a claim at `now` may take, from what <base>limit holds (0
 * where a field is absent): the rate `max` per `per` ms (both 0: none), the
 * window `window` whose use is `used`, the back-off's end `until`.  -1 (no
 * limit applies), 0 (none: *reopen is when the claim may look again -- the
 * back-off's end, or the next window's start) or the jobs left in the
 * window.  *used_now is the window's use before this claim (0 for a new
 * window). */
EMQ_EXPORT long long emq_rate_allowance(long long max, long long per, long long window, long long used,
                                        long long until, long long now, long long *used_now, long long *reopen);

#endif
