/* emq_core.h -- the decisions of EMQ.EXTEND and EMQ.SWEEP that need no server.
 *
 * Nothing here includes the module API: these functions take bytes and
 * numbers and return verdicts, so the tests call them in-process (cffi)
 * and the glue in emq.c stays a thin layer of open/check/write/reply.
 *
 * Every function that can refuse returns NULL on success, or the exact
 * error reply (a static string, "ERR ..." without the leading '-'). */
#ifndef EMQ_CORE_H
#define EMQ_CORE_H

#include <stddef.h>
#include <stdint.h>

/* The largest integer a double holds exactly, and so the latest deadline a
 * sorted-set score can carry without rounding: 2^53 ms is year 287396. */
/* emq.so is built with hidden visibility; only the module entry point and
 * these functions are exported (the tests call them through cffi). */
#define EMQ_EXPORT __attribute__((visibility("default")))

#define EMQ_MAX_EXACT_SCORE 9007199254740992LL

/* Parse a canonical base-10 signed 64-bit integer: an optional '-', then
 * digits, no leading zeros, no '+', no spaces, no overflow (the same strings
 * Redis itself accepts as integers).  Returns 0 and sets *out, or -1. */
EMQ_EXPORT int emq_parse_ll(const char *s, size_t len, long long *out);

/* <lease-ms>: an integer >= 1 whose deadline now_ms + lease is still an exact
 * integer score.  Sets *deadline_ms on success. */
EMQ_EXPORT const char *emq_lease_deadline(long long now_ms, const char *s, size_t len,
                               long long *deadline_ms);

/* A count argument (<max-stalled>, <limit>, <max-attempts>): an integer >= 1.
 * `what` names the argument in the error. */
EMQ_EXPORT const char *emq_parse_count(const char *what, const char *s, size_t len, long long *out);

/* 1 when key is exactly base followed by suffix, else 0. */
EMQ_EXPORT int emq_key_is(const char *key, size_t keylen, const char *base, size_t baselen,
               const char *suffix);

/* 1 when every key that starts with `base` hashes to the slot of base's own
 * hash tag: base has a '{' followed later in base by a '}' with at least one
 * byte between.  Without that, base + "job:" + id could hash anywhere (an id
 * may even supply the closing brace). */
EMQ_EXPORT int emq_base_has_hash_tag(const char *base, size_t len);

/* The row's stall count after one more stall, as HINCRBY stalled 1 computes
 * it: a missing field counts as 0.  Refuses a field that is not an integer
 * and an increment that would overflow. */
EMQ_EXPORT const char *emq_next_stalled(const char *cur, size_t len, int present, long long *next);

/* The row's fencing token after one more claim, as HINCRBY attempts 1
 * computes it (same refusals). */
EMQ_EXPORT const char *emq_next_attempts(const char *cur, size_t len, int present, long long *next);

/* The threshold: a job whose stall count reached max_stalled is dead. */
EMQ_EXPORT int emq_stall_is_dead(long long stalled, long long max_stalled);

/* The failed-metric count after adding `deaths` (same refusals as above). */
EMQ_EXPORT const char *emq_add_failed(const char *cur, size_t len, int present, long long deaths,
                           long long *next);

#endif
