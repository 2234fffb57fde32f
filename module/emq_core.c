/* emq_core.c -- see emq_core.h.  Plain C99, no module API. */
#include "emq_core.h"

#include <limits.h>
#include <string.h>

static const char *const error_texts[EMQ_ERR_COUNT_] = {
    [EMQ_OK] = NULL,
    [EMQ_ERR_LEASE_NOT_INTEGER] = "ERR lease-ms is not an integer",
    [EMQ_ERR_LEASE_TOO_SMALL] = "ERR lease-ms must be at least 1",
    [EMQ_ERR_LEASE_TOO_LARGE] = "ERR lease-ms is too large: the deadline would not be an exact score",
    [EMQ_ERR_MAX_STALLED] = "ERR max-stalled must be an integer >= 1",
    [EMQ_ERR_LIMIT] = "ERR limit must be an integer >= 1",
    [EMQ_ERR_MAX_ATTEMPTS] = "ERR max-attempts must be an integer >= 1",
    [EMQ_ERR_CLAIM_COUNT] = "ERR COUNT must be an integer >= 1",
    [EMQ_ERR_LIMIT_TOO_LARGE] = "ERR limit exceeds the server's emq.max-limit",
    [EMQ_ERR_DELAY] = "ERR DELAY must be an integer >= 0",
    [EMQ_ERR_DELAY_TOO_LARGE] = "ERR DELAY is too large: the due time would not be an exact score",
    [EMQ_ERR_AT] = "ERR AT must be an integer >= 0 (unix time in milliseconds)",
    [EMQ_ERR_AT_TOO_LARGE] = "ERR AT is too large: the due time would not be an exact score",
    [EMQ_ERR_DELAY_AND_AT] = "ERR DELAY and AT cannot be used together",
    [EMQ_ERR_BLOCK] = "ERR BLOCK must be an integer >= 0 (0 waits forever)",
    [EMQ_ERR_BLOCK_TOO_LARGE] = "ERR BLOCK is too large: the wait would not end at an exact time",
    [EMQ_ERR_MANY_COUNT] = "ERR count must be an integer >= 1",
    [EMQ_ERR_MANY_TOO_MANY] = "ERR count exceeds the server's emq.max-limit",
    [EMQ_ERR_MANY_DUPLICATE] = "ERR the same id appears twice in one EMQ.ENQUEUEMANY",
    [EMQ_ERR_FORGET_TOO_MANY] = "ERR the number of ids exceeds the server's emq.max-limit",
    [EMQ_ERR_SAME_KEY] = "ERR <active> and <job> must be different keys",
    [EMQ_ERR_THREE_SETS] =
        "ERR <active>, <pending> and <dead> must be <base>active, <base>pending and <base>dead",
    [EMQ_ERR_PENDING_KEY] = "ERR <pending> must be <base>pending",
    [EMQ_ERR_PENDING_ACTIVE_KEYS] = "ERR <pending> and <active> must be <base>pending and <base>active",
    [EMQ_ERR_PENDING_ACTIVE_ORDER] = "ERR <active> and <pending> must be <base>active and <base>pending",
    [EMQ_ERR_NO_HASH_TAG] = "ERR in cluster mode <base> must contain a hash tag, e.g. emq:{queue}:",
    [EMQ_ERR_WRONGTYPE] = "WRONGTYPE Operation against a key holding the wrong kind of value",
    [EMQ_ERR_NOPERM_DERIVED] =
        "NOPERM this user has no permissions to access the job rows or metrics derived from <base>",
    [EMQ_ERR_STALLED_NOT_INTEGER] = "ERR a swept job row has a 'stalled' field that is not an integer",
    [EMQ_ERR_ATTEMPTS_NOT_INTEGER] = "ERR the job row's 'attempts' field is not an integer",
    [EMQ_ERR_TRIES_NOT_INTEGER] = "ERR the job row's 'tries' field is not an integer",
    [EMQ_ERR_FAILED_NOT_INTEGER] = "ERR the metrics:failed 'count' field is not an integer",
    [EMQ_ERR_OVERFLOW] = "ERR increment or decrement would overflow",
    [EMQ_ERR_STALE_EXTEND] = "EMQSTALE extend token mismatch",
    [EMQ_ERR_STALE_COMPLETE] = "EMQSTALE complete token mismatch",
    [EMQ_ERR_STALE_FAIL] = "EMQSTALE fail token mismatch",
    [EMQ_ERR_STALE_RELEASE] = "EMQSTALE release token mismatch",
    [EMQ_ERR_NOT_ACTIVE] = "EMQSTALE job is no longer active",
    [EMQ_ERR_EXISTS] = "EMQEXISTS a job with this id already exists",
    [EMQ_ERR_JOB_KEY] = "ERR <job> must be <base>job:<id>, where <active> is <base>active",
    [EMQ_ERR_META_NOT_INTEGER] = "ERR the queue's meta hash holds a setting that is not an integer",
    [EMQ_ERR_TRYAGAIN] = "TRYAGAIN a key of this queue is moving between cluster nodes; retry",
    [EMQ_ERR_SYNTAX] = "ERR syntax error",
    [EMQ_ERR_REQ_EMPTY] = "ERR the REQ request id must not be empty",
    [EMQ_ERR_REQ_RECORD] = "ERR the record of this REQ request id is malformed or another call's",
    [EMQ_ERR_STATE_TOO_LARGE] = "ERR the checkpoint state is larger than emq.max-state-bytes",
    [EMQ_ERR_OOM] = "OOM command not allowed when used memory > 'maxmemory'.",
    [EMQ_ERR_RETENTION_VALUE] =
        "ERR a retention must be -1 (keep forever) or an integer from 0 to 9007199254740992 (ms)",
    [EMQ_ERR_DEAD_PENDING_KEYS] = "ERR <dead> and <pending> must be <base>dead and <base>pending",
    [EMQ_ERR_DEAD_KEY] = "ERR <dead> must be <base>dead",
    [EMQ_ERR_UNTIL] = "ERR UNTIL must be an integer (server ms)",
    [EMQ_ERR_RETRIES_NOT_INTEGER] = "ERR the job row's 'retries' field is not an integer",
    [EMQ_ERR_STATE_PENDING] = "EMQSTATE the job is pending: only a dead or cancelled job can be retried",
    [EMQ_ERR_STATE_ACTIVE] = "EMQSTATE the job is active: only a dead or cancelled job can be retried",
    [EMQ_ERR_STATE_DONE] = "EMQSTATE the job is done: only a dead or cancelled job can be retried",
    [EMQ_ERR_STATE_UNKNOWN] =
        "EMQSTATE the job has no known state: only a dead or cancelled job can be retried",
    [EMQ_ERR_BUSY] = "EMQBUSY the queue has active jobs: obliterate it with FORCE to delete them too",
    [EMQ_ERR_PRIORITY] = "ERR PRIORITY must be an integer from -1000 to 1000",
    [EMQ_ERR_RATE_MAX] = "ERR RATE must be an integer from 1 to 1000000000",
    [EMQ_ERR_RATE_PER] = "ERR PER must be an integer from 1 to 86400000 (ms)",
    [EMQ_ERR_BACKOFF] = "ERR BACKOFF must be an integer from 0 to 86400000 (ms)",
    [EMQ_ERR_LIMIT_FIELD] = "ERR the queue's limit hash holds a field that is not a valid integer",
    [EMQ_ERR_PRIORITY_FIELD] = "ERR the job row's 'priority' field is not an integer from -1000 to 1000",
    [EMQ_ERR_PAYLOAD_TOO_LARGE] = "ERR the payload is larger than emq.max-payload-bytes",
    [EMQ_ERR_RESULT_TOO_LARGE] = "ERR the result is larger than emq.max-result-bytes",
    [EMQ_ERR_TRACE_TOO_LARGE] = "ERR the TRACE is larger than 65536 bytes",
    [EMQ_ERR_PROGRESS_TOO_LARGE] = "ERR the progress is larger than emq.max-state-bytes",
    [EMQ_ERR_UNIQUE_KEY] = "ERR the UNIQUE key must be 1 to 512 bytes long",
    [EMQ_ERR_UNIQUE_FOR] = "ERR FOR must be an integer from 1 to 2592000000 (ms: 30 days)",
    [EMQ_ERR_UNIQUE_UNTIL] = "ERR UNTIL takes only 'done' (a time window is FOR <ms>)",
    [EMQ_ERR_UNIQUE_FOR_AND_UNTIL] = "ERR FOR and UNTIL cannot be used together",
    [EMQ_ERR_UNIQUE_NEEDED] = "ERR FOR, UNTIL and REPLACE need UNIQUE <key>",
    [EMQ_ERR_UNIQUE_MANY] = "ERR UNIQUE is for one job: EMQ.ENQUEUEMANY does not take it",
    [EMQ_ERR_GROUP] = "ERR GROUP must be 1 to 128 bytes of letters, digits and -_.:@",
    [EMQ_ERR_GROUP_FIELD] = "ERR the group hash's 'active' field is not an integer from 0 to 2^53",
    [EMQ_ERR_AFTER_TOO_MANY] = "ERR AFTER takes at most 1000 dependencies",
    [EMQ_ERR_AFTER_EMPTY_ID] = "ERR a dependency id must not be empty",
    [EMQ_ERR_AFTER_SELF] = "ERR a job cannot depend on itself",
    [EMQ_ERR_AFTER_POLICY] = "ERR ON_PARENT_FAILURE must be fail, ignore or continue",
    [EMQ_ERR_AFTER_MISSING] = "ERR MISSING takes only 'done' (without it a missing dependency is refused)",
    [EMQ_ERR_AFTER_NEEDED] = "ERR ON_PARENT_FAILURE and MISSING need AFTER <id> ...",
    [EMQ_ERR_AFTER_MANY] = "ERR AFTER is for one job: EMQ.ENQUEUEMANY does not take it",
    [EMQ_ERR_AFTER_FIELD] = "ERR the job's 'waits' field is not an integer from 1 to 1000",
    [EMQ_ERR_GROUP_MAX] = "ERR MAX must be an integer from 1 to 1000000000",
    [EMQ_ERR_GROUP_MAX_FIELD] = "ERR the group hash's 'max' field is not an integer from 1 to 1000000000",
    [EMQ_ERR_GROUP_WALK] = "ERR the queue has more than 10000 groups: set MAX on each group, not *",
    [EMQ_ERR_GROUP_DEFAULT_FIELD] = "ERR the queue's meta hash's 'group_max' field is not an integer from 1 to 1000000000",
};

const char *emq_error_text(int err) {
    if (err <= EMQ_OK || err >= EMQ_ERR_COUNT_) return NULL;
    return error_texts[err];
}

/* -- numbers ------------------------------------------------------------ */

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

int emq_lease_deadline(long long now_ms, const char *s, size_t len, long long *deadline_ms) {
    long long lease;
    if (emq_parse_ll(s, len, &lease) != 0) return EMQ_ERR_LEASE_NOT_INTEGER;
    if (lease < 1) return EMQ_ERR_LEASE_TOO_SMALL;
    /* Compare by subtraction: now + lease itself could overflow. */
    if (now_ms < 0 || now_ms > EMQ_MAX_EXACT_SCORE || lease > EMQ_MAX_EXACT_SCORE - now_ms)
        return EMQ_ERR_LEASE_TOO_LARGE;
    *deadline_ms = now_ms + lease;
    return EMQ_OK;
}

int emq_parse_count(int which, const char *s, size_t len, long long *out) {
    static const int refusal[] = {
        [EMQ_COUNT_MAX_STALLED] = EMQ_ERR_MAX_STALLED,
        [EMQ_COUNT_LIMIT] = EMQ_ERR_LIMIT,
        [EMQ_COUNT_MAX_ATTEMPTS] = EMQ_ERR_MAX_ATTEMPTS,
        [EMQ_COUNT_CLAIM] = EMQ_ERR_CLAIM_COUNT,
    };
    long long v;
    if (emq_parse_ll(s, len, &v) != 0 || v < 1) return refusal[which];
    *out = v;
    return EMQ_OK;
}

/* now_ms + add, when both and the sum lie in [0, 2^53]. */
static int exact_sum(long long now_ms, long long add, long long *out) {
    if (now_ms < 0 || now_ms > EMQ_MAX_EXACT_SCORE || add < 0 || add > EMQ_MAX_EXACT_SCORE - now_ms) return -1;
    *out = now_ms + add;
    return 0;
}

int emq_due_after_delay(long long now_ms, const char *s, size_t len, long long *due_ms) {
    long long delay;
    if (emq_parse_ll(s, len, &delay) != 0 || delay < 0) return EMQ_ERR_DELAY;
    return exact_sum(now_ms, delay, due_ms) == 0 ? EMQ_OK : EMQ_ERR_DELAY_TOO_LARGE;
}

int emq_due_at(long long now_ms, const char *s, size_t len, long long *due_ms) {
    long long at;
    if (emq_parse_ll(s, len, &at) != 0 || at < 0) return EMQ_ERR_AT;
    if (at > EMQ_MAX_EXACT_SCORE || now_ms < 0 || now_ms > EMQ_MAX_EXACT_SCORE) return EMQ_ERR_AT_TOO_LARGE;
    *due_ms = at; /* a time already past is kept: emq_lanes_enter orders it among the due jobs by it */
    return EMQ_OK;
}

int emq_parse_block(long long now_ms, const char *s, size_t len, long long *block_ms) {
    long long block, end;
    if (emq_parse_ll(s, len, &block) != 0 || block < 0) return EMQ_ERR_BLOCK;
    if (exact_sum(now_ms, block, &end) != 0) return EMQ_ERR_BLOCK_TOO_LARGE;
    *block_ms = block;
    return EMQ_OK;
}

int emq_parse_many_count(const char *s, size_t len, long long max, long long *out) {
    long long v;
    if (emq_parse_ll(s, len, &v) != 0 || v < 1) return EMQ_ERR_MANY_COUNT;
    if (v > max) return EMQ_ERR_MANY_TOO_MANY;
    *out = v;
    return EMQ_OK;
}

int emq_parse_limit(const char *s, size_t len, long long max, long long *out) {
    long long v;
    if (emq_parse_ll(s, len, &v) != 0 || v < 1) return EMQ_ERR_LIMIT;
    if (v > max) return EMQ_ERR_LIMIT_TOO_LARGE;
    *out = v;
    return EMQ_OK;
}

int emq_count_fits(long long count, int per, int from, int argc) {
    /* Divide instead of multiplying: per * count could overflow (a count of
     * 2^62 + 1 wrapped 4 + 2 * count to 6, and the cast to int truncated). */
    if (count < 0 || per < 1 || from < 0 || argc < from) return 0;
    return count <= (long long)((argc - from) / per);
}

/* Byte order, shorter first on a common prefix. */
static int bytes_cmp(const char *a, size_t alen, const char *b, size_t blen) {
    size_t n = alen < blen ? alen : blen;
    int c = n ? memcmp(a, b, n) : 0;
    if (c) return c;
    return alen < blen ? -1 : alen > blen;
}

static void sift_down(const char *const *items, const size_t *lens, long *order, long root, long n) {
    for (;;) {
        long child = 2 * root + 1;
        if (child >= n) return;
        if (child + 1 < n && bytes_cmp(items[order[child]], lens[order[child]], items[order[child + 1]],
                                       lens[order[child + 1]]) < 0)
            child++;
        if (bytes_cmp(items[order[root]], lens[order[root]], items[order[child]], lens[order[child]]) >= 0) return;
        long t = order[root];
        order[root] = order[child];
        order[child] = t;
        root = child;
    }
}

long emq_first_duplicate(const char *const *items, const size_t *lens, long n, long *order) {
    /* Heap sort of the indices (no allocation, no comparison context),
     * then equal neighbours. */
    for (long i = 0; i < n; i++) order[i] = i;
    for (long i = n / 2 - 1; i >= 0; i--) sift_down(items, lens, order, i, n);
    for (long end = n - 1; end > 0; end--) {
        long t = order[0];
        order[0] = order[end];
        order[end] = t;
        sift_down(items, lens, order, 0, end);
    }
    for (long i = 1; i < n; i++)
        if (bytes_cmp(items[order[i - 1]], lens[order[i - 1]], items[order[i]], lens[order[i]]) == 0)
            return order[i];
    return -1;
}

int emq_incr(const char *cur, size_t len, int present, long long add, int not_integer,
             long long *next) {
    long long v = 0;
    if (present && emq_parse_ll(cur, len, &v) != 0) return not_integer;
    if ((add > 0 && v > LLONG_MAX - add) || (add < 0 && v < LLONG_MIN - add)) return EMQ_ERR_OVERFLOW;
    *next = v + add;
    return EMQ_OK;
}

int emq_next_stalled(const char *cur, size_t len, int present, long long *next) {
    return emq_incr(cur, len, present, 1, EMQ_ERR_STALLED_NOT_INTEGER, next);
}

int emq_next_attempts(const char *cur, size_t len, int present, long long *next) {
    return emq_incr(cur, len, present, 1, EMQ_ERR_ATTEMPTS_NOT_INTEGER, next);
}

int emq_add_failed(const char *cur, size_t len, int present, long long deaths, long long *next) {
    return emq_incr(cur, len, present, deaths, EMQ_ERR_FAILED_NOT_INTEGER, next);
}

/* -- keys --------------------------------------------------------------- */

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

int emq_job_key_matches(const char *active, size_t activelen, const char *job, size_t joblen,
                        const char *id, size_t idlen) {
    static const char suffix[] = "active", mid[] = "job:";
    const size_t slen = sizeof suffix - 1, mlen = sizeof mid - 1;
    if (activelen < slen || memcmp(active + activelen - slen, suffix, slen) != 0) return 0;
    size_t baselen = activelen - slen;
    return joblen == baselen + mlen + idlen && memcmp(job, active, baselen) == 0 &&
           memcmp(job + baselen, mid, mlen) == 0 && memcmp(job + baselen + mlen, id, idlen) == 0;
}

int emq_option_is(const char *arg, size_t len, const char *name) {
    if (len != strlen(name)) return 0;
    for (size_t i = 0; i < len; i++) {
        unsigned char a = (unsigned char)arg[i], b = (unsigned char)name[i];
        if (a >= 'a' && a <= 'z') a = (unsigned char)(a - 'a' + 'A');
        if (b >= 'a' && b <= 'z') b = (unsigned char)(b - 'a' + 'A');
        if (a != b) return 0;
    }
    return 1;
}

/* -- request records ---------------------------------------------------- */

static size_t decimal_digits(size_t v) {
    size_t n = 1;
    while (v >= 10) {
        v /= 10;
        n++;
    }
    return n;
}

size_t emq_record_item_size(size_t len) {
    return decimal_digits(len) + 1 + len;
}

size_t emq_record_put(char *out, const char *item, size_t len) {
    size_t digits = decimal_digits(len), v = len;
    for (size_t i = digits; i > 0; i--) {
        out[i - 1] = (char)('0' + (int)(v % 10));
        v /= 10;
    }
    out[digits] = ':';
    if (len) memcpy(out + digits + 1, item, len);
    return digits + 1 + len;
}

int emq_record_next(const char *rec, size_t reclen, size_t *pos, const char **item, size_t *len) {
    size_t p = *pos;
    if (p == reclen) return 0;
    size_t v = 0, start = p;
    while (p < reclen && rec[p] >= '0' && rec[p] <= '9' && p - start < 12) v = v * 10 + (size_t)(rec[p++] - '0');
    if (p == start || p >= reclen || rec[p] != ':') return -1;
    p++;
    if (v > reclen - p) return -1;
    *item = rec + p;
    *len = v;
    *pos = p + v;
    return 1;
}

int emq_claim_record_check(const char *rec, size_t len, long *pairs) {
    size_t pos = 0, itemlen;
    const char *item;
    long items = 0;
    int more;
    while ((more = emq_record_next(rec, len, &pos, &item, &itemlen)) == 1) {
        (void)item;
        if (++items > 2L * EMQ_MAX_CLAIM_COUNT) return EMQ_ERR_REQ_RECORD;
        if (items % 2 == 0 && (itemlen == 0 || itemlen >= EMQ_TOKEN_MAX)) return EMQ_ERR_REQ_RECORD;
    }
    if (more < 0 || items == 0 || items % 2) return EMQ_ERR_REQ_RECORD;
    *pairs = items / 2;
    return EMQ_OK;
}

int emq_enqueue_record(long long count, char *out) { return emq_format_ll(count < 0 ? 0 : count, out); }

int emq_format_ll(long long v, char *out) {
    /* the magnitude as unsigned: -LLONG_MIN does not fit a long long */
    unsigned long long m = v < 0 ? 0ULL - (unsigned long long)v : (unsigned long long)v;
    char digits[24];
    int n = 0, len = 0;
    do {
        digits[n++] = (char)('0' + (int)(m % 10));
        m /= 10;
    } while (m);
    if (v < 0) out[len++] = '-';
    while (n) out[len++] = digits[--n];
    return len;
}

/* -- tokens ------------------------------------------------------------- */

int emq_format_token(long long attempts, const unsigned char *random8, char *out) {
    static const char hex[] = "0123456789abcdef";
    int len = emq_format_ll(attempts, out);
    out[len++] = '-';
    for (int i = 0; i < 8; i++) {
        out[len++] = hex[random8[i] >> 4];
        out[len++] = hex[random8[i] & 15];
    }
    out[len] = '\0';
    return len;
}

/* -- transitions -------------------------------------------------------- */

int emq_stall_is_dead(long long stalled, long long max_stalled) {
    return stalled >= max_stalled;
}

int emq_holder(int has_token, int token_matches, int is_active) {
    if (!has_token) return EMQ_HOLDER_GONE;
    if (!token_matches) return EMQ_HOLDER_STALE_TOKEN;
    return is_active ? EMQ_HOLDER_OK : EMQ_HOLDER_NOT_ACTIVE;
}

int emq_holder_error(int verb, int holder) {
    static const int stale_token[] = {
        [EMQ_VERB_EXTEND] = EMQ_ERR_STALE_EXTEND,
        [EMQ_VERB_COMPLETE] = EMQ_ERR_STALE_COMPLETE,
        [EMQ_VERB_FAIL] = EMQ_ERR_STALE_FAIL,
        [EMQ_VERB_RELEASE] = EMQ_ERR_STALE_RELEASE,
    };
    if (holder == EMQ_HOLDER_STALE_TOKEN) return stale_token[verb];
    if (holder == EMQ_HOLDER_NOT_ACTIVE) return EMQ_ERR_NOT_ACTIVE;
    return EMQ_OK;
}

static int is(const char *s, size_t len, const char *word);

const char *emq_verb_name(int verb) {
    static const char *const names[] = {
        [EMQ_VERB_EXTEND] = "extend",
        [EMQ_VERB_COMPLETE] = "complete",
        [EMQ_VERB_FAIL] = "fail",
        [EMQ_VERB_RELEASE] = "release",
    };
    return names[verb];
}

int emq_is_retry_of(int verb, int holder, const char *closed_by, size_t len) {
    if (holder != EMQ_HOLDER_NOT_ACTIVE || closed_by == NULL) return 0;
    const char *name = emq_verb_name(verb);
    size_t n = strlen(name);
    return len >= n && memcmp(closed_by, name, n) == 0 && (len == n || closed_by[n] == ':');
}

int emq_closed_route(const char *closed_by, size_t len) {
    const char *colon = closed_by ? memchr(closed_by, ':', len) : NULL;
    if (colon == NULL) return EMQ_FAIL_TO_PENDING;
    const char *where = colon + 1;
    size_t wlen = len - (size_t)(where - closed_by);
    if (is(where, wlen, "dead")) return EMQ_FAIL_TO_DEAD;
    if (is(where, wlen, "cancelled")) return EMQ_FAIL_TO_CANCELLED;
    return EMQ_FAIL_TO_PENDING;
}

int emq_fail_route(long long attempts, long long max_attempts, int cancel_requested, int dead) {
    if (cancel_requested) return EMQ_FAIL_TO_CANCELLED;
    return dead || attempts >= max_attempts ? EMQ_FAIL_TO_DEAD : EMQ_FAIL_TO_PENDING;
}

static int is(const char *s, size_t len, const char *word) {
    return len == strlen(word) && memcmp(s, word, len) == 0;
}

int emq_state_is_finished(const char *state, size_t len) {
    return is(state, len, "done") || is(state, len, "dead") || is(state, len, "cancelled");
}

int emq_cancel_decide(int row_exists, int in_pending, int finished) {
    if (!row_exists) return EMQ_CANCEL_GONE;
    if (in_pending) return EMQ_CANCEL_NOW;
    return finished ? EMQ_CANCEL_FINISHED : EMQ_CANCEL_REQUEST;
}

/* -- the v3 keyspace ------------------------------------------------------ */

int emq_parse_priority(const char *s, size_t len, long long *out) {
    long long v;
    if (emq_parse_ll(s, len, &v) != 0 || v < EMQ_PRIORITY_MIN || v > EMQ_PRIORITY_MAX) return EMQ_ERR_PRIORITY;
    *out = v;
    return EMQ_OK;
}

int emq_row_priority(const char *s, size_t len, int present, long long *out) {
    if (!present) {
        *out = 0;
        return EMQ_OK;
    }
    return emq_parse_priority(s, len, out) == EMQ_OK ? EMQ_OK : EMQ_ERR_PRIORITY_FIELD;
}

long long emq_priority_score(long long level, long long seq) {
    return (level + 1024) * EMQ_SEQ_LIMIT + seq;
}

long long emq_priority_level(double score) {
    /* Scores are exact integers below 2^53: the division is too. */
    long long s = (long long)score;
    return s / EMQ_SEQ_LIMIT - 1024;
}

long long emq_next_seq(long long seq, int lane_empty) {
    if (lane_empty || seq < EMQ_SEQ_TAIL_FIRST || seq >= EMQ_SEQ_LIMIT - 1) return EMQ_SEQ_TAIL_FIRST;
    return seq + 1;
}

long long emq_head_seq(long long first, int has_first, long n, long i) {
    long long top = EMQ_SEQ_TAIL_FIRST - 1;
    if (has_first && first - 1 < top) top = first - 1;
    long long seq = top - (long long)(n - 1 - i);
    return seq < 0 ? 0 : seq;
}

int emq_parse_meta_counter(const char *s, size_t len, int present, long long *out) {
    long long v = 0;
    if (present && (emq_parse_ll(s, len, &v) != 0 || v < 0)) return EMQ_ERR_META_NOT_INTEGER;
    *out = v;
    return EMQ_OK;
}

int emq_parse_group(const char *s, size_t len) {
    if (s == NULL || len == 0 || len > EMQ_GROUP_MAX) return EMQ_ERR_GROUP;
    for (size_t i = 0; i < len; i++) {
        unsigned char c = (unsigned char)s[i];
        int ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-' ||
                 c == '_' || c == '.' || c == ':' || c == '@';
        if (!ok) return EMQ_ERR_GROUP;
    }
    return EMQ_OK;
}

int emq_parse_group_active(const char *s, size_t len, int present, long long *out) {
    long long v = 0;
    if (present && (emq_parse_ll(s, len, &v) != 0 || v < 0 || v > EMQ_MAX_EXACT_SCORE)) return EMQ_ERR_GROUP_FIELD;
    *out = v;
    return EMQ_OK;
}

int emq_parse_group_max(const char *s, size_t len, long long *out) {
    long long v;
    if (s == NULL || emq_parse_ll(s, len, &v) != 0 || v < 1 || v > EMQ_GROUP_CAP_MAX) return EMQ_ERR_GROUP_MAX;
    *out = v;
    return EMQ_OK;
}

int emq_parse_group_max_field(const char *s, size_t len, int present, long long *out) {
    if (!present) {
        *out = EMQ_NO_CAP;
        return EMQ_OK;
    }
    return emq_parse_group_max(s, len, out) ? EMQ_ERR_GROUP_MAX_FIELD : EMQ_OK;
}

int emq_group_claimable(int lane_has_job, int paused, long long active, long long cap) {
    return lane_has_job && !paused && active < cap;
}

int emq_entry_live(int row_exists, int state_pending, int has_priority, int in_delayed, int taken) {
    return row_exists && state_pending && !has_priority && !in_delayed && !taken;
}

int emq_member_live(int row_exists, int state_pending) {
    return row_exists && state_pending;
}

int emq_priority_goes_first(long long level) {
    return level < 0;
}

int emq_pieces(size_t len) {
    if (len <= EMQ_PIECE_BYTES || len > EMQ_PIECED_MAX) return 1;
    return (int)((len + EMQ_PIECE_BYTES - 1) / EMQ_PIECE_BYTES);
}

/* -- retention ---------------------------------------------------------- */

int emq_retain(long long now_ms, long long ttl_ms, long long *at_ms) {
    if (ttl_ms < 0) return EMQ_RETAIN_KEEP;
    if (ttl_ms == 0) return EMQ_RETAIN_DELETE;
    *at_ms = now_ms + ttl_ms;
    return EMQ_RETAIN_EXPIRE;
}

static int parse_retention_as(const char *s, size_t len, long long *out, int refusal) {
    long long v;
    if (emq_parse_ll(s, len, &v) != 0 || v < EMQ_KEEP_FOREVER || v > EMQ_MAX_EXACT_SCORE) return refusal;
    *out = v;
    return EMQ_OK;
}

int emq_parse_retention(const char *s, size_t len, long long *out) {
    return parse_retention_as(s, len, out, EMQ_ERR_META_NOT_INTEGER);
}

/* -- the operator verbs ------------------------------------------------- */

int emq_parse_retention_arg(const char *s, size_t len, long long *out) {
    return parse_retention_as(s, len, out, EMQ_ERR_RETENTION_VALUE);
}

int emq_parse_until(const char *s, size_t len, long long *out) {
    return emq_parse_ll(s, len, out) == 0 ? EMQ_OK : EMQ_ERR_UNTIL;
}

int emq_retry_check(const char *state, size_t len) {
    if (state == NULL) return EMQ_ERR_STATE_UNKNOWN;
    if (is(state, len, "dead") || is(state, len, "cancelled")) return EMQ_OK;
    if (is(state, len, "pending")) return EMQ_ERR_STATE_PENDING;
    if (is(state, len, "active")) return EMQ_ERR_STATE_ACTIVE;
    if (is(state, len, "done")) return EMQ_ERR_STATE_DONE;
    return EMQ_ERR_STATE_UNKNOWN;
}

int emq_purge_deletes_row(int row_exists, const char *state, size_t len) {
    return !row_exists || (state != NULL && is(state, len, "dead"));
}

int emq_forget_deletes_row(const char *state, size_t len) {
    return state != NULL && (is(state, len, "done") || is(state, len, "cancelled"));
}

/* -- flow control ------------------------------------------------------- */

static int parse_range(const char *s, size_t len, long long min, long long max, int refusal, long long *out) {
    long long v;
    if (emq_parse_ll(s, len, &v) != 0 || v < min || v > max) return refusal;
    *out = v;
    return EMQ_OK;
}

int emq_parse_rate_max(const char *s, size_t len, long long *out) {
    return parse_range(s, len, 1, EMQ_RATE_MAX_MAX, EMQ_ERR_RATE_MAX, out);
}

int emq_parse_rate_per(const char *s, size_t len, long long *out) {
    return parse_range(s, len, 1, EMQ_RATE_PER_MAX, EMQ_ERR_RATE_PER, out);
}

int emq_parse_backoff(const char *s, size_t len, long long *out) {
    return parse_range(s, len, 0, EMQ_RATE_PER_MAX, EMQ_ERR_BACKOFF, out);
}

int emq_parse_limit_field(const char *s, size_t len, int present, long long min, long long max, long long *out) {
    if (!present) {
        *out = 0;
        return EMQ_OK;
    }
    return parse_range(s, len, min, max, EMQ_ERR_LIMIT_FIELD, out);
}

void emq_rate_window(long long now, long long per, long long *start) {
    /* The server clock is never before 1970: now >= 0, so % is the floor. */
    *start = now - now % per;
}

long long emq_rate_allowance(long long max, long long per, long long window, long long used, long long until,
                             long long now, long long *used_now, long long *reopen) {
    *used_now = 0;
    *reopen = -1;
    if (until > now) {
        *reopen = until;
        return 0;
    }
    if (max == 0) return -1;
    long long start;
    emq_rate_window(now, per, &start);
    *used_now = window == start ? used : 0;
    if (*used_now >= max) {
        *reopen = start + per;
        return 0;
    }
    return max - *used_now;
}
