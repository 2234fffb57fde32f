/* emq_schedules.h -- the server fires due schedule ticks itself (issue 44).
 *
 * A schedule is written by the clients (python/echomq/schedules.py): a row
 * <base>schedule:<name> and a member <name> of <base>schedules scored with
 * its next tick.  With emq.schedule-timer yes (the default), a master keeps
 * an index of the databases' schedule sets in module memory and, while the
 * index is not empty, fires their due ticks (a timer that sleeps until the
 * earliest tick ahead, at most EMQ_SCHEDULE_TIMER_MS)
 * exactly as a client's drive would: the same ticks, the same job ids
 * (<name>@<tick>), the same cursor.  Cron parsing stays in Python: a cron
 * schedule fires from the ticks a client stored in its row, and only while
 * one of them is still ahead (then every due one is known).
 *
 * The pure part -- which ticks fire, given the row -- is below, without the
 * module API (emq_schedule_rules.c); emq_schedules.c holds the index, the
 * timer and the writes. */
#ifndef EMQ_SCHEDULES_H
#define EMQ_SCHEDULES_H

#include <stddef.h>

#include "emq_core.h"
#include "emq_rm.h"

#define EMQ_SCHEDULE_TIMER_MS 50
#define EMQ_SCHEDULE_STORED_TICKS 8         /* schedules.STORED_TICKS */
#define EMQ_SCHEDULE_ON_TIME_MS 60000       /* schedules.ON_TIME_MS */
#define EMQ_SCHEDULE_MISSED_CEILING 1000    /* schedules.MISSED_CEILING */
#define EMQ_SCHEDULE_MAX_EVERY_MS (366LL * 86400000LL)
#define EMQ_SCHEDULE_MAX_MS (1LL << 53)

enum { EMQ_MISSED_SKIP, EMQ_MISSED_ONE, EMQ_MISSED_ALL };

/* A row's definition and cursor, parsed. */
typedef struct {
    int is_cron;
    long long every_ms; /* when !is_cron */
    int has_start, has_end;
    long long start_at, end_at;
    int missed;
    long long last;
    int nticks; /* cron: the stored ticks, ascending */
    long long ticks[EMQ_SCHEDULE_STORED_TICKS];
} EmqScheduleRow;

/* What one fire does: the ticks to enqueue (oldest first), the new cursor
 * and the next ticks to store.  fire points into a caller's buffer of
 * EMQ_SCHEDULE_MISSED_CEILING. */
typedef struct {
    long long *fire;
    int nfire;
    long long cursor;
    int nupcoming;
    long long upcoming[EMQ_SCHEDULE_STORED_TICKS];
} EmqScheduleFiring;

enum {
    EMQ_PLAN_FIRE,      /* the firing is known: write it */
    EMQ_PLAN_NOT_DUE,   /* nothing due: the cursor stays (the next ticks are still written) */
    EMQ_PLAN_OUT_OF_TICKS, /* cron: every stored tick is due; the clients compute the rest */
};

/* Parse the row's fields (NULL where absent); 0, or a static text saying
 * what is malformed. */
EMQ_EXPORT const char *emq_schedule_parse(EmqScheduleRow *row, const char *cron, size_t cronlen,
                                          const char *every, size_t everylen, const char *start, size_t startlen,
                                          const char *end, size_t endlen, const char *missed, size_t missedlen,
                                          const char *last, size_t lastlen, const char *ticks, size_t tickslen);

/* schedules.plan for this row at now_ms, into *out (out->fire: a buffer of
 * EMQ_SCHEDULE_MISSED_CEILING); one of EMQ_PLAN_*. */
EMQ_EXPORT int emq_schedule_plan(const EmqScheduleRow *row, long long now_ms, EmqScheduleFiring *out);

/* 1 when name is 1 to 128 of A-Z a-z 0-9 _ . : - (schedules._NAME). */
EMQ_EXPORT int emq_schedule_name_ok(const char *name, size_t len);

/* -- the glue (emq_schedules.c) ---------------------------------------- */

/* At load: subscribe to the keyspace and server events, start the first
 * scan.  ERR (logged) when the server refuses a subscription. */
int emq_schedules_load(RedisModuleCtx *ctx);
void emq_schedules_unload(RedisModuleCtx *ctx);

/* emq.schedule-timer changed (CONFIG SET). */
void emq_schedules_setting_changed(void);

/* 1 while the module's own timer calls our verbs: they run for no client,
 * so there is no user to check derived keys against (emq_acl_user). */
int emq_schedules_internal_call(void);

#endif
