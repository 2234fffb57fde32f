/* emq_core.c -- see emq_core.h.  Plain C99, no module API. */
#include "emq_core.h"

#include <limits.h>
#include <string.h>

int emq_parse_ll(const char *s, size_t len, long long *out) {
    if (s == NULL || len == 0 || len > 20) return -1;
    size_t i = 0;
    int negative = 0;
    if (s[0] == '-') {
        negative = 1;
        i = 1;
        if (len == 1) return -1;
    }
    /* "0" is the only number that may start with 0; "-0" and "007" are not
     * canonical, and accepting them would let two spellings mean one token. */
    if (s[i] == '0') {
        if (len == 1) {
            *out = 0;
            return 0;
        }
        return -1;
    }
    /* Accumulate as a negative number: its range is one larger, so
     * LLONG_MIN parses without overflow. */
    long long v = 0;
    for (; i < len; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c < '0' || c > '9') return -1;
        int d = c - '0';
        if (v < (LLONG_MIN + d) / 10) return -1;
        v = v * 10 - d;
    }
    if (!negative) {
        if (v == LLONG_MIN) return -1;
        v = -v;
    }
    *out = v;
    return 0;
}

const char *emq_lease_deadline(long long now_ms, const char *s, size_t len,
                               long long *deadline_ms) {
    long long lease;
    if (emq_parse_ll(s, len, &lease) != 0) return "ERR lease-ms is not an integer";
    if (lease < 1) return "ERR lease-ms must be at least 1";
    /* Compare by subtraction: now + lease itself could overflow. */
    if (now_ms < 0 || now_ms > EMQ_MAX_EXACT_SCORE || lease > EMQ_MAX_EXACT_SCORE - now_ms)
        return "ERR lease-ms is too large: the deadline would not be an exact score";
    *deadline_ms = now_ms + lease;
    return NULL;
}

const char *emq_parse_count(const char *what, const char *s, size_t len, long long *out) {
    long long v;
    int ok = emq_parse_ll(s, len, &v) == 0 && v >= 1;
    if (!ok) {
        if (strcmp(what, "max-stalled") == 0) return "ERR max-stalled must be an integer >= 1";
        if (strcmp(what, "max-attempts") == 0) return "ERR max-attempts must be an integer >= 1";
        return "ERR limit must be an integer >= 1";
    }
    *out = v;
    return NULL;
}

int emq_key_is(const char *key, size_t keylen, const char *base, size_t baselen,
               const char *suffix) {
    size_t sufflen = strlen(suffix);
    if (keylen != baselen + sufflen) return 0;
    return memcmp(key, base, baselen) == 0 && memcmp(key + baselen, suffix, sufflen) == 0;
}

int emq_base_has_hash_tag(const char *base, size_t len) {
    const char *open = memchr(base, '{', len);
    if (open == NULL) return 0;
    size_t rest = len - (size_t)(open - base) - 1;
    const char *close = memchr(open + 1, '}', rest);
    return close != NULL && close > open + 1;
}

static const char *add_checked(const char *cur, size_t len, int present, long long add,
                               long long *next, const char *not_integer) {
    long long v = 0;
    if (present && emq_parse_ll(cur, len, &v) != 0) return not_integer;
    if (v > LLONG_MAX - add) return "ERR increment or decrement would overflow";
    *next = v + add;
    return NULL;
}

const char *emq_next_stalled(const char *cur, size_t len, int present, long long *next) {
    return add_checked(cur, len, present, 1, next,
                       "ERR a swept job row has a 'stalled' field that is not an integer");
}

const char *emq_next_attempts(const char *cur, size_t len, int present, long long *next) {
    return add_checked(cur, len, present, 1, next,
                       "ERR the job row's 'attempts' field is not an integer");
}

int emq_stall_is_dead(long long stalled, long long max_stalled) {
    return stalled >= max_stalled;
}

const char *emq_add_failed(const char *cur, size_t len, int present, long long deaths,
                           long long *next) {
    return add_checked(cur, len, present, deaths, next,
                       "ERR the metrics:failed 'count' field is not an integer");
}
