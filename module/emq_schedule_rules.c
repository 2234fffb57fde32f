/* emq_schedule_rules.c -- which ticks a schedule's fire enqueues, given its
 * row: python/echomq/schedules.py's `plan` in C, without the module API
 * (tests/tasks/test_schedule_timer.py checks one against the other through
 * cffi).  The timer that applies them is emq_schedules.c. */
#include <limits.h>
#include <string.h>

#include "emq_schedules.h"

int emq_schedule_name_ok(const char *name, size_t len) {
    if (len < 1 || len > 128) return 0;
    for (size_t i = 0; i < len; i++) {
        unsigned char c = (unsigned char)name[i];
        int ok = (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '_' ||
                 c == '.' || c == ':' || c == '-';
        if (!ok) return 0;
    }
    return 1;
}

static int parse_ms(const char *s, size_t len, long long lo, long long hi, long long *out) {
    return emq_parse_ll(s, len, out) == 0 && *out >= lo && *out <= hi;
}

const char *emq_schedule_parse(EmqScheduleRow *row, const char *cron, size_t cronlen, const char *every,
                               size_t everylen, const char *start, size_t startlen, const char *end, size_t endlen,
                               const char *missed, size_t missedlen, const char *last, size_t lastlen,
                               const char *ticks, size_t tickslen) {
    memset(row, 0, sizeof *row);
    if ((cron == NULL) == (every == NULL)) return "needs exactly one of cron and every_ms";
    row->is_cron = cron != NULL;
    (void)cronlen;
    if (every && !parse_ms(every, everylen, 1, EMQ_SCHEDULE_MAX_EVERY_MS, &row->every_ms))
        return "every_ms is not an integer from 1 to 31622400000";
    if (start) {
        if (!parse_ms(start, startlen, 0, EMQ_SCHEDULE_MAX_MS, &row->start_at))
            return "start_at is not epoch ms from 0 to 2**53";
        row->has_start = 1;
    }
    if (end) {
        if (!parse_ms(end, endlen, 0, EMQ_SCHEDULE_MAX_MS, &row->end_at)) return "end_at is not epoch ms from 0 to 2**53";
        row->has_end = 1;
    }
    if (row->has_start && row->has_end && row->end_at < row->start_at) return "end_at comes before start_at";
    if (missed == NULL || (missedlen == 4 && memcmp(missed, "skip", 4) == 0))
        row->missed = EMQ_MISSED_SKIP;
    else if (missedlen == 3 && memcmp(missed, "one", 3) == 0)
        row->missed = EMQ_MISSED_ONE;
    else if (missedlen == 3 && memcmp(missed, "all", 3) == 0)
        row->missed = EMQ_MISSED_ALL;
    else
        return "missed is not one of skip, one, all";
    row->last = 0;
    if (last && !parse_ms(last, lastlen, -EMQ_SCHEDULE_MAX_MS, EMQ_SCHEDULE_MAX_MS, &row->last))
        return "last is not epoch ms";
    if (row->is_cron && ticks) {
        size_t i = 0;
        while (i < tickslen) {
            size_t j = i;
            while (j < tickslen && ticks[j] != ',') j++;
            if (j > i) {
                long long t;
                if (row->nticks == EMQ_SCHEDULE_STORED_TICKS) return "ticks holds more than 8 ticks";
                if (!parse_ms(ticks + i, j - i, 0, EMQ_SCHEDULE_MAX_MS, &t)) return "ticks is not a list of epoch ms";
                if (row->nticks && t <= row->ticks[row->nticks - 1]) return "ticks are not ascending";
                row->ticks[row->nticks++] = t;
            }
            i = j + 1;
        }
    }
    return NULL;
}

/* Python's floor division, for b > 0. */
static long long floor_div(long long a, long long b) {
    long long q = a / b;
    return (a % b != 0 && a < 0) ? q - 1 : q;
}

/* Schedule.ticks_after for every_ms: up to count ticks strictly after
 * `after` (fewer once end_at comes); the number written. */
static int every_ticks_after(const EmqScheduleRow *row, long long after, int count, long long *out) {
    if (row->has_start && after < row->start_at - 1) after = row->start_at - 1;
    long long anchor = row->has_start ? row->start_at : 0;
    long long tick = anchor + (floor_div(after - anchor, row->every_ms) + 1) * row->every_ms;
    int n = 0;
    while (n < count && (!row->has_end || tick <= row->end_at)) {
        out[n++] = tick;
        tick += row->every_ms;
    }
    return n;
}

int emq_schedule_plan(const EmqScheduleRow *row, long long now_ms, EmqScheduleFiring *out) {
    out->nfire = 0;
    out->cursor = row->last;
    long long *due = out->fire;
    int ndue = 0;
    if (row->is_cron) {
        /* The stored ticks are the next ones after the cursor: the due set
         * is known when one of them is still ahead. */
        int ahead = 0;
        for (int i = 0; i < row->nticks; i++) {
            if (row->ticks[i] <= row->last) continue;
            if (row->ticks[i] > now_ms) {
                ahead = 1;
                break;
            }
            due[ndue++] = row->ticks[i];
        }
        /* None ahead (every stored tick is due, or none is stored past the
         * cursor): what comes next needs cronsim, the clients'. */
        if (!ahead) return EMQ_PLAN_OUT_OF_TICKS;
    } else {
        long long first;
        if (every_ticks_after(row, row->last, 1, &first) == 1 && first <= now_ms) {
            long long end = row->has_end && row->end_at < now_ms ? row->end_at : now_ms;
            long long total = (end - first) / row->every_ms + 1;
            long long kept = total < EMQ_SCHEDULE_MISSED_CEILING ? total : EMQ_SCHEDULE_MISSED_CEILING;
            long long newest = first + (total - 1) * row->every_ms;
            for (long long i = kept - 1; i >= 0; i--) due[ndue++] = newest - i * row->every_ms;
        }
    }
    if (ndue == 0) {
        if (row->is_cron) {
            out->nupcoming = 0;
            for (int i = 0; i < row->nticks; i++)
                if (row->ticks[i] > row->last) out->upcoming[out->nupcoming++] = row->ticks[i];
        } else {
            out->nupcoming = every_ticks_after(row, row->last, EMQ_SCHEDULE_STORED_TICKS, out->upcoming);
        }
        return EMQ_PLAN_NOT_DUE;
    }
    long long latest = due[ndue - 1];
    if (row->missed == EMQ_MISSED_ALL) {
        out->nfire = ndue;
    } else if (row->missed == EMQ_MISSED_ONE || now_ms - latest <= EMQ_SCHEDULE_ON_TIME_MS) {
        due[0] = latest;
        out->nfire = 1;
    }
    out->cursor = latest;
    if (row->is_cron) {
        /* What is left of the stored ticks (a prefix of the true next ones:
         * the clients top them up to 8). */
        out->nupcoming = 0;
        for (int i = 0; i < row->nticks; i++)
            if (row->ticks[i] > latest) out->upcoming[out->nupcoming++] = row->ticks[i];
    } else {
        out->nupcoming = every_ticks_after(row, latest, EMQ_SCHEDULE_STORED_TICKS, out->upcoming);
    }
    return EMQ_PLAN_FIRE;
}
