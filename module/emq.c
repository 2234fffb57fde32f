/* emq.c -- EchoMQ's lifecycle controls as native Redis commands:
 * loading, the one table every command is registered from, and the strings
 * made at load.  What the module is, and which file holds which verb: emq.h.
 *
 * Every command reads the server clock once, validates every argument, key
 * type and row before its first write (a command that answers an error has
 * changed nothing), uses the low-level key API, and propagates its effects
 * as core commands with absolute values -- never the command itself -- so a
 * replica or an AOF replay never reads a clock of its own. */
#include <stdio.h>
#include <string.h>

#include "emq.h"
#include "emq_meta.h"
#include "emq_schedules.h"

#define EMQ_MODULE_VERSION 1

EmqStrings emq_str;
RedisModuleString *emq_small_int[EMQ_SMALL_INTS];

int emq_reply_error(RedisModuleCtx *ctx, int err) {
    return RedisModule_ReplyWithError(ctx, emq_error_text(err));
}

/* -- the command table -------------------------------------------------------
 *
 * One row per command, with everything the server is told about it
 * (emq_meta.h derives the arity, key specs, legacy key range and ACL
 * categories from the row).
 *
 * Flags, and why:
 *   - `write` everywhere: every verb changes a queue (EXTEND only re-scores).
 *   - `deny-oom` where a verb grows memory (new rows, error texts, a cancel
 *     reason, a stall count on a recovered row, a claim's or an enqueue's
 *     request record).  EXTEND, CHECKPOINT,
 *     COMPLETE and RELEASE are not: live handlers must keep their leases,
 *     finish their jobs and give them back under memory pressure -- they
 *     only re-score or overwrite.
 *   - `fast` where the work is O(log N) per call; SWEEP moves up to <limit>
 *     jobs and ENQUEUEMANY writes up to emq.max-limit rows: they are not.
 *   - CLAIM may wait (BLOCK <ms>): it is in @blocking through its row's
 *     categories, not through the `blocking` flag, which Redis 6.2 does not
 *     know (it would refuse to create the command).
 *   - The operator verbs (emq_dead.c, emq_admin.c): RETRY and RETRYDEAD
 *     put work back (deny-oom); RETENTION writes a setting (deny-oom);
 *     PAUSE, RESUME and LIMIT are not deny-oom (an incident may be memory pressure,
 *     and pausing must still work then); PURGE, OBLITERATE and FORGET free
 *     memory and are not deny-oom.  RETRYDEAD, PURGE, OBLITERATE (up to
 *     <limit> each) and FORGET (one row per id) are not `fast`.  GROUPLIMIT
 *     is neither deny-oom (as LIMIT) nor `fast` (a group leaving the ring
 *     rewrites the ring: O(groups waiting)).
 * ACL categories follow: @write, @fast or @slow, and @emq.
 *
 * Key flags say what the verb does to each declared key (the ACL check of a
 * %R~ or %W~ user follows them): RW/RO/OW, one of INSERT (adds members or
 * creates), UPDATE (changes what is there), DELETE (removes members), and
 * ACCESS when the verb reads the key's data to decide or to reply -- a
 * membership test, as in ZADD XX or ZREM, is not.  The job rows and the
 * metric derived from <base> are checked by the verbs themselves
 * (emq_acl_may, emq_keys.h).
 *
 * An optional argument is one more line, e.g. for CLAIM's
 * `[COUNT count] [BLOCK ms]` and ENQUEUE's `[DELAY ms | AT unix-time-ms]`:
 *     EMQ_OPTION("COUNT", "count", EMQ_INTEGER),
 *     EMQ_OPTION("BLOCK", "ms", EMQ_INTEGER),
 *     EMQ_ONE_OF("when", EMQ_CHOICE("DELAY", "ms", EMQ_INTEGER),
 *                        EMQ_CHOICE("AT", "unix-time-ms", EMQ_UNIX_TIME)),
 * and `<id> <payload> [<id> <payload> ...]` is
 *     EMQ_REPEATED("job", EMQ_ARG("id", EMQ_STRING), EMQ_ARG("payload", EMQ_STRING)). */
#define EMQ_SINCE "0.1.0"
/* ENQUEUE's and ENQUEUEMANY's `[DELAY ms | AT unix-time-ms]`. */
#define EMQ_WHEN                                                           \
    EMQ_ONE_OF("when", EMQ_CHOICE("DELAY", "ms", EMQ_INTEGER),             \
               EMQ_CHOICE("AT", "unix-time-ms", EMQ_UNIX_TIME))
#define LOG_ACTIVE "O(log N) where N is the number of active jobs"

static const EmqCommand commands[] = {
    {"emq.extend", EmqExtend_RedisCommand, "write fast",
     .summary = "Extends a held job's lease to server time + lease-ms, if the token still holds the job",
     .complexity = LOG_ACTIVE, .since = EMQ_SINCE,
     .args = EMQ_ARGS(EMQ_ARG_KEY("active", EMQ_RW | EMQ_UPDATE), EMQ_ARG_KEY("job", EMQ_RO | EMQ_ACCESS),
                      EMQ_ARG("id", EMQ_STRING), EMQ_ARG("token", EMQ_STRING),
                      EMQ_ARG("lease-ms", EMQ_INTEGER))},
    {"emq.checkpoint", EmqCheckpoint_RedisCommand, "write fast",
     .summary = "Extends a held job's lease as EMQ.EXTEND does, stores its state and progress, and returns its "
                "cancel request",
     .complexity = LOG_ACTIVE, .since = EMQ_SINCE,
     .args = EMQ_ARGS(EMQ_ARG_KEY("active", EMQ_RW | EMQ_UPDATE),
                      EMQ_ARG_KEY("job", EMQ_RW | EMQ_ACCESS | EMQ_UPDATE), EMQ_ARG("id", EMQ_STRING),
                      EMQ_ARG("token", EMQ_STRING), EMQ_ARG("lease-ms", EMQ_INTEGER),
                      EMQ_OPTION("STATE", "state", EMQ_STRING), EMQ_OPTION("PROGRESS", "progress", EMQ_STRING))},
    {"emq.sweep", EmqSweep_RedisCommand, "write deny-oom",
     .summary = "Sends jobs whose lease lapsed back to the head of their lane, or to dead once they stalled "
                "max-stalled times",
     .complexity = "O(log N + M) where N is the number of active jobs and M the number swept (at most limit) and "
                   "promoted (at most 1000)",
     .since = EMQ_SINCE, .tips = "nondeterministic_output",
     .args = EMQ_ARGS(EMQ_ARG_KEY("active", EMQ_RW | EMQ_ACCESS | EMQ_DELETE),
                      EMQ_ARG_KEY("pending", EMQ_RW | EMQ_INSERT),
                      EMQ_ARG_KEY("dead", EMQ_RW | EMQ_ACCESS | EMQ_UPDATE), EMQ_ARG_BASE,
                      EMQ_ARG("max-stalled", EMQ_INTEGER), EMQ_ARG("limit", EMQ_INTEGER))},
    {"emq.enqueue", EmqEnqueue_RedisCommand, "write deny-oom fast",
     .summary = "Adds a job: creates its row and queues its id in its lane, claimable now or at a due time",
     .complexity = "O(1) for priority 0, else O(log N) where N is the number of jobs of the other levels (or "
                   "delayed)",
     .since = EMQ_SINCE,
     .args = EMQ_ARGS(EMQ_ARG_KEY("pending", EMQ_RW | EMQ_INSERT), EMQ_ARG_BASE, EMQ_ARG("id", EMQ_STRING),
                      EMQ_ARG("payload", EMQ_STRING), EMQ_WHEN, EMQ_OPTION("PRIORITY", "priority", EMQ_INTEGER),
                      EMQ_OPTION("GROUP", "group", EMQ_STRING), EMQ_OPTION("REQ", "request-id", EMQ_STRING),
                      EMQ_OPTION("UNIQUE", "key", EMQ_STRING),
                      EMQ_ONE_OF("unique-hold", EMQ_CHOICE("FOR", "ms", EMQ_INTEGER),
                                 EMQ_CHOICE("UNTIL", "done", EMQ_STRING)),
                      EMQ_FLAG("REPLACE"), EMQ_OPTION("ON_PARENT_FAILURE", "policy", EMQ_STRING),
                      EMQ_OPTION("MISSING", "done", EMQ_STRING), EMQ_OPTION_MANY("AFTER", "dep-id", EMQ_STRING))},
    {"emq.enqueuemany", EmqEnqueueMany_RedisCommand, "write deny-oom",
     .summary = "Adds count jobs in one call, all or none: a row each and one entry each in their lane",
     .complexity = "O(M) for priority 0, else O(M log N), where M is the number added and N the number of jobs "
                   "of the other levels (or delayed)",
     .since = EMQ_SINCE,
     .args = EMQ_ARGS(EMQ_ARG_KEY("pending", EMQ_RW | EMQ_INSERT), EMQ_ARG_BASE, EMQ_ARG("count", EMQ_INTEGER),
                      EMQ_REPEATED("job", EMQ_ARG("id", EMQ_STRING), EMQ_ARG("payload", EMQ_STRING)), EMQ_WHEN,
                      EMQ_OPTION("PRIORITY", "priority", EMQ_INTEGER), EMQ_OPTION("GROUP", "group", EMQ_STRING),
                      EMQ_OPTION("REQ", "request-id", EMQ_STRING))},
    {"emq.claim", EmqClaim_RedisCommand, "write deny-oom fast",
     .summary = "Leases the next claimable jobs in priority order (waiting for one with BLOCK): ids, fresh tokens, "
                "payloads, states",
     .complexity = "O(M log N) where N is the number of waiting jobs and M the number claimed, promoted (at most "
                   "1000) and dropped (at most 1000)",
     .since = EMQ_SINCE, .tips = "nondeterministic_output", .categories = "blocking",
     .args = EMQ_ARGS(EMQ_ARG_KEY("pending", EMQ_RW | EMQ_ACCESS | EMQ_DELETE),
                      EMQ_ARG_KEY("active", EMQ_RW | EMQ_INSERT), EMQ_ARG_BASE,
                      EMQ_ARG("lease-ms", EMQ_INTEGER), EMQ_OPTION("COUNT", "count", EMQ_INTEGER),
                      EMQ_OPTION("REQ", "request-id", EMQ_STRING), EMQ_OPTION("BLOCK", "ms", EMQ_INTEGER))},
    {"emq.complete", EmqComplete_RedisCommand, "write fast",
     .summary = "Marks a held job done (keeping its result) and removes it from active, if the token still holds "
                "the job",
     .complexity = LOG_ACTIVE, .since = EMQ_SINCE,
     .args = EMQ_ARGS(EMQ_ARG_KEY("active", EMQ_RW | EMQ_DELETE),
                      EMQ_ARG_KEY("job", EMQ_RW | EMQ_ACCESS | EMQ_UPDATE),
                      EMQ_ARG("id", EMQ_STRING), EMQ_ARG("token", EMQ_STRING),
                      EMQ_OPTION("RESULT", "result", EMQ_STRING))},
    {"emq.completeclaim", EmqCompleteClaim_RedisCommand, "write deny-oom fast",
     .summary = "EMQ.COMPLETE, then EMQ.CLAIM, in one call: finishes a held job and leases the next ones",
     .complexity = "O(log N + M) where N is the number of pending and active jobs and M the number claimed",
     .since = EMQ_SINCE, .tips = "nondeterministic_output",
     .args = EMQ_ARGS(EMQ_ARG_KEY("active", EMQ_RW | EMQ_UPDATE),
                      EMQ_ARG_KEY("job", EMQ_RW | EMQ_ACCESS | EMQ_UPDATE),
                      EMQ_ARG_KEY("pending", EMQ_RW | EMQ_ACCESS | EMQ_DELETE), EMQ_ARG("id", EMQ_STRING),
                      EMQ_ARG("token", EMQ_STRING), EMQ_ARG("lease-ms", EMQ_INTEGER),
                      EMQ_OPTION("COUNT", "count", EMQ_INTEGER), EMQ_OPTION("REQ", "request-id", EMQ_STRING),
                      EMQ_OPTION("RESULT", "result", EMQ_STRING))},
    {"emq.fail", EmqFail_RedisCommand, "write deny-oom fast",
     .summary = "Records a held job's failure: back to its lane for another attempt, or dead at max-attempts "
                "(or at once with DEAD)",
     .complexity = LOG_ACTIVE, .since = EMQ_SINCE,
     .args = EMQ_ARGS(EMQ_ARG_KEY("active", EMQ_RW | EMQ_DELETE), EMQ_ARG_KEY("pending", EMQ_RW | EMQ_INSERT),
                      EMQ_ARG_KEY("dead", EMQ_RW | EMQ_INSERT), EMQ_ARG_BASE, EMQ_ARG("id", EMQ_STRING),
                      EMQ_ARG("token", EMQ_STRING), EMQ_ARG("max-attempts", EMQ_INTEGER),
                      EMQ_ARG("error", EMQ_STRING), EMQ_OPTION("DELAY", "ms", EMQ_INTEGER),
                      EMQ_OPTION("TRACE", "traceback", EMQ_STRING), EMQ_FLAG("DEAD"))},
    {"emq.release", EmqRelease_RedisCommand, "write fast",
     .summary = "Gives a held job back to the head of its lane without using an attempt, if the token still "
                "holds it",
     .complexity = LOG_ACTIVE, .since = EMQ_SINCE,
     .args = EMQ_ARGS(EMQ_ARG_KEY("active", EMQ_RW | EMQ_DELETE), EMQ_ARG_KEY("pending", EMQ_RW | EMQ_INSERT),
                      EMQ_ARG_BASE, EMQ_ARG("id", EMQ_STRING), EMQ_ARG("token", EMQ_STRING),
                      EMQ_OPTION("BACKOFF", "ms", EMQ_INTEGER))},
    {"emq.cancel", EmqCancel_RedisCommand, "write deny-oom fast",
     .summary = "Cancels a job: at once when it is waiting, else at its holder's next EMQ.CHECKPOINT",
     .complexity = "O(1) for priority 0 (its entry stays, a tombstone), else O(log N) where N is the number of "
                   "jobs of the other levels (or delayed)",
     .since = EMQ_SINCE,
     .args = EMQ_ARGS(EMQ_ARG_KEY("pending", EMQ_RO), EMQ_ARG_BASE, EMQ_ARG("id", EMQ_STRING),
                      EMQ_ARG("reason", EMQ_STRING))},
    {"emq.retry", EmqRetry_RedisCommand, "write deny-oom fast",
     .summary = "Sends a dead or cancelled job back to the tail of its lane with a fresh retry budget",
     .complexity = "O(log N) where N is the number of dead jobs", .since = EMQ_SINCE,
     .args = EMQ_ARGS(EMQ_ARG_KEY("dead", EMQ_RW | EMQ_DELETE), EMQ_ARG_KEY("pending", EMQ_RW | EMQ_INSERT),
                      EMQ_ARG_BASE, EMQ_ARG("id", EMQ_STRING))},
    {"emq.retrydead", EmqRetryDead_RedisCommand, "write deny-oom",
     .summary = "Retries up to limit dead jobs, oldest death first, each with a fresh retry budget",
     .complexity = "O(log N + M) where N is the number of dead jobs and M the number retried, at most limit",
     .since = EMQ_SINCE,
     .args = EMQ_ARGS(EMQ_ARG_KEY("dead", EMQ_RW | EMQ_ACCESS | EMQ_DELETE),
                      EMQ_ARG_KEY("pending", EMQ_RW | EMQ_INSERT), EMQ_ARG_BASE, EMQ_ARG("limit", EMQ_INTEGER),
                      EMQ_OPTION("UNTIL", "unix-time-ms", EMQ_UNIX_TIME))},
    {"emq.purge", EmqPurge_RedisCommand, "write",
     .summary = "Deletes up to limit dead jobs and their rows, oldest death first",
     .complexity = "O(log N + M) where N is the number of dead jobs and M the number purged, at most limit",
     .since = EMQ_SINCE,
     .args = EMQ_ARGS(EMQ_ARG_KEY("dead", EMQ_RW | EMQ_ACCESS | EMQ_DELETE), EMQ_ARG_BASE,
                      EMQ_ARG("limit", EMQ_INTEGER), EMQ_OPTION("UNTIL", "unix-time-ms", EMQ_UNIX_TIME))},
    {"emq.retention", EmqRetention_RedisCommand, "write deny-oom fast",
     .summary = "Sets or reads how long the queue keeps done, cancelled and dead jobs' rows",
     .complexity = "O(1)", .since = EMQ_SINCE,
     .args = EMQ_ARGS(EMQ_ARG_KEY("pending", EMQ_RO), EMQ_ARG_BASE, EMQ_OPTION("DONE", "ms", EMQ_INTEGER),
                      EMQ_OPTION("CANCELLED", "ms", EMQ_INTEGER), EMQ_OPTION("DEAD", "ms", EMQ_INTEGER))},
    {"emq.pause", EmqPause_RedisCommand, "write fast",
     .summary = "Pauses a queue: claims hand out nothing until EMQ.RESUME; running jobs go on",
     .complexity = "O(1)", .since = EMQ_SINCE, .args = EMQ_ARGS(EMQ_ARG_KEY("pending", EMQ_RO), EMQ_ARG_BASE)},
    {"emq.resume", EmqResume_RedisCommand, "write fast",
     .summary = "Resumes a paused queue: claims hand out jobs again",
     .complexity = "O(1)", .since = EMQ_SINCE, .args = EMQ_ARGS(EMQ_ARG_KEY("pending", EMQ_RO), EMQ_ARG_BASE)},
    {"emq.limit", EmqLimit_RedisCommand, "write fast",
     .summary = "Sets, removes or reads the queue's rate limit (at most max jobs claimed per window of ms) "
                "and its back-off",
     .complexity = "O(1)", .since = EMQ_SINCE,
     .args = EMQ_ARGS(EMQ_ARG_KEY("pending", EMQ_RO), EMQ_ARG_BASE, EMQ_OPTION("RATE", "max", EMQ_INTEGER),
                      EMQ_OPTION("PER", "ms", EMQ_INTEGER), EMQ_FLAG("OFF"),
                      EMQ_OPTION("BACKOFF", "ms", EMQ_INTEGER))},
    {"emq.grouplimit", EmqGroupLimit_RedisCommand, "write",
     .summary = "Sets, removes or reads one group's cap (at most max of its jobs active at once) and pauses "
                "or resumes the group",
     .complexity = "O(1), or O(G) where G is the number of groups waiting when the group leaves the ring",
     .since = EMQ_SINCE,
     .args = EMQ_ARGS(EMQ_ARG_KEY("pending", EMQ_RO), EMQ_ARG_BASE, EMQ_ARG("group", EMQ_STRING),
                      EMQ_OPTION("MAX", "max", EMQ_INTEGER), EMQ_FLAG("NOMAX"), EMQ_FLAG("PAUSE"),
                      EMQ_FLAG("RESUME"))},
    {"emq.obliterate", EmqObliterate_RedisCommand, "write",
     .summary = "Deletes a queue in bounded steps: up to limit jobs and their rows per call, then its keys",
     .complexity = "O(log N + M) where N is the number of jobs in the queue's sets and M at most limit",
     .since = EMQ_SINCE,
     .args = EMQ_ARGS(EMQ_ARG_KEY("active", EMQ_RW | EMQ_ACCESS | EMQ_DELETE),
                      EMQ_ARG_KEY("pending", EMQ_RW | EMQ_ACCESS | EMQ_DELETE),
                      EMQ_ARG_KEY("dead", EMQ_RW | EMQ_ACCESS | EMQ_DELETE), EMQ_ARG_BASE,
                      EMQ_ARG("limit", EMQ_INTEGER), EMQ_FLAG("FORCE"))},
    {"emq.forget", EmqForget_RedisCommand, "write",
     .summary = "Deletes the rows of the given jobs that are done or cancelled (in no set); others stay",
     .complexity = "O(N) where N is the number of ids", .since = EMQ_SINCE,
     .args = EMQ_ARGS(EMQ_ARG_KEY("pending", EMQ_RO), EMQ_ARG_BASE,
                      EMQ_REPEATED("ids", EMQ_ARG("id", EMQ_STRING)))},
};

/* -- the strings made at load ---------------------------------------------- */

static RedisModuleString *const_string(const char *s) {
    return RedisModule_CreateString(NULL, s, strlen(s));
}

static void create_strings(void) {
#define EMQ_STRING_MAKE(name, text) emq_str.name = const_string(text);
    EMQ_STRINGS(EMQ_STRING_MAKE)
#undef EMQ_STRING_MAKE
    for (int i = 0; i < EMQ_SMALL_INTS; i++) {
        char buf[4];
        int n = snprintf(buf, sizeof buf, "%d", i);
        emq_small_int[i] = RedisModule_CreateString(NULL, buf, (size_t)n);
    }
    static const char *const valued[EMQ_VALUES] = {"payload", "result"};
    for (int v = 0; v < EMQ_VALUES; v++) {
        emq_piece_name[v][0] = const_string(valued[v]);
        for (int i = 1; i < EMQ_MAX_PIECES; i++) {
            char buf[32];
            int n = snprintf(buf, sizeof buf, "%s:%d", valued[v], i);
            emq_piece_name[v][i] = RedisModule_CreateString(NULL, buf, (size_t)n);
        }
    }
}

static void free_strings(void) {
#define EMQ_STRING_FREE(name, text)                                   \
    if (emq_str.name) RedisModule_FreeString(NULL, emq_str.name);     \
    emq_str.name = NULL;
    EMQ_STRINGS(EMQ_STRING_FREE)
#undef EMQ_STRING_FREE
    for (int i = 0; i < EMQ_SMALL_INTS; i++) {
        if (emq_small_int[i]) RedisModule_FreeString(NULL, emq_small_int[i]);
        emq_small_int[i] = NULL;
    }
    for (int v = 0; v < EMQ_VALUES; v++)
        for (int i = 0; i < EMQ_MAX_PIECES; i++) {
            if (emq_piece_name[v][i]) RedisModule_FreeString(NULL, emq_piece_name[v][i]);
            emq_piece_name[v][i] = NULL;
        }
}

/* -- loading --------------------------------------------------------------- */

/* What each optional API function is for, so that a server older than the
 * API says in its log exactly what falls back (the module still loads). */
static const char *fallback_of(const char *fn) {
    static const struct {
        const char *fn, *fallback;
    } fallbacks[] = {
        {"IsModuleNameBusy", "a second module named 'emq' is not detected at load time"},
        {"GetCommand", "no command metadata and no ACL categories (see SetCommandInfo and "
                       "SetCommandACLCategories)"},
        {"SetCommandInfo", "COMMAND INFO shows arity -1 and one generic key spec, COMMAND DOCS nothing; "
                           "the commands check their arity themselves"},
        {"SetCommandACLCategories", "the EMQ commands are in no ACL category, so -@write does not deny them: "
                                    "deny each by name (docs/reference/acl.md)"},
        {"AddACLCategory", "no @emq ACL category; the commands are still in @write and @fast or @slow"},
        {"RegisterNumericConfig", "no CONFIG SET emq.*: the settings are fixed at load (load arguments "
                                  "max-limit <n> max-state-bytes <n> max-payload-bytes <n> "
                                  "max-result-bytes <n>)"},
        {"LoadConfigs", "no CONFIG SET emq.*: the settings are fixed at load"},
        {"RegisterBoolConfig", "no CONFIG SET emq.*: the settings are fixed at load (load argument "
                               "schedule-timer yes|no)"},
        {"ListGet", "a claim reads the head of <pending> with LRANGE (RedisModule_Call), a little slower"},
        {"PublishMessageShard", "a job that ends is announced on <base>done:<id> with PUBLISH, not SPUBLISH "
                                "(this server has no sharded pub/sub)"},
    };
    for (size_t i = 0; i < sizeof fallbacks / sizeof *fallbacks; i++)
        if (strcmp(fn, fallbacks[i].fn) == 0) return fallbacks[i].fallback;
    return "the EMQ verbs cannot check the keys they derive from <base> (job rows, settings, "
           "metric, request records) against the caller's ACL (the declared keys are still "
           "checked by the server)";
}

static void log_fallbacks(RedisModuleCtx *ctx) {
    const char *const *missing = emq_rm_missing_optional();
    for (size_t i = 0; missing[i]; i++)
        RedisModule_Log(ctx, "warning", "this server has no RedisModule_%s; falling back: %s",
                        missing[i], fallback_of(missing[i]));
    if (missing[0] == NULL)
        RedisModule_Log(ctx, "notice", "loaded; every optional module API function was found");
    RedisModule_Log(ctx, "notice",
                    "settings: max-limit %lld, max-state-bytes %lld, max-payload-bytes %lld, "
                    "max-result-bytes %lld, schedule-timer %s (%s)",
                    emq_config_max_limit(), emq_config_max_state_bytes(), emq_config_max_payload_bytes(),
                    emq_config_max_result_bytes(), emq_config_schedule_timer() ? "yes" : "no",
                    emq_config_is_live() ? "CONFIG SET emq.<name> changes them"
                                         : "fixed at load: this server has no module configs");
}

EMQ_EXPORT int RedisModule_OnLoad(RedisModuleCtx *ctx, RedisModuleString **argv, int argc) {
    /* Every refusal below says why in the server log before it returns. */
    if (emq_rm_init(ctx, "emq", EMQ_MODULE_VERSION) != REDISMODULE_OK) return REDISMODULE_ERR;
    /* A key opened for writing is signalled as modified only when a verb
     * really changed it (emq_key_close): an error or a no-op must not abort
     * other clients' WATCH or invalidate their client-side caches. */
    RedisModule_SetModuleOptions(ctx, REDISMODULE_OPTION_NO_IMPLICIT_SIGNAL_MODIFIED);
    if (emq_config_load_args(ctx, argv, argc) != REDISMODULE_OK) return REDISMODULE_ERR;
    EmqMetaSupport support;
    if (emq_meta_prepare(ctx, &support) != REDISMODULE_OK) return REDISMODULE_ERR;
    create_strings();
    int ok = 1;
    for (size_t i = 0; ok && i < sizeof commands / sizeof *commands; i++)
        ok = emq_meta_register(ctx, &commands[i], &support) == REDISMODULE_OK;
    if (ok) ok = emq_config_register(ctx) == REDISMODULE_OK;
    if (ok) ok = emq_schedules_load(ctx) == REDISMODULE_OK;
    if (!ok) {
        /* The server unregisters the commands of a module whose OnLoad
         * failed, but the strings we made are ours to free. */
        emq_schedules_unload(ctx);
        free_strings();
        return REDISMODULE_ERR;
    }
    log_fallbacks(ctx);
    return REDISMODULE_OK;
}

EMQ_EXPORT int RedisModule_OnUnload(RedisModuleCtx *ctx) {
    emq_schedules_unload(ctx);
    emq_wake_unload(ctx);
    emq_keys_unload();
    free_strings();
    return REDISMODULE_OK;
}
