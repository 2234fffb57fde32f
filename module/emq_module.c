/* emq_module.c -- EchoMQ's lifecycle controls as native Redis commands:
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

#define EMQ_MODULE_VERSION 1

EmqStrings emq_str;
RedisModuleString *emq_small_int[EMQ_SMALL_INTS];

int emq_reply_error(RedisModuleCtx *ctx, int err) {
    return RedisModule_ReplyWithError(ctx, emq_error_text(err));
}

/* -- the command table -------------------------------------------------------
 *
 * Flags, and why:
 *   - `write` everywhere: every verb changes a queue (EXTEND only re-scores).
 *   - `deny-oom` where a verb grows memory (new rows, error texts, a cancel
 *     reason, a stall count on a recovered row, a claim's request record).  EXTEND, CHECKPOINT,
 *     COMPLETE and RELEASE are not: live handlers must keep their leases,
 *     finish their jobs and give them back under memory pressure -- they
 *     only re-score or overwrite.
 *   - `fast` where the work is O(log N) per call; SWEEP moves up to <limit>
 *     jobs and is not.
 *   - The operator verbs (emq_dead.c, emq_admin.c): RETRY and RETRYDEAD
 *     put work back (deny-oom); RETENTION writes a setting (deny-oom);
 *     PAUSE and RESUME are not deny-oom (an incident may be memory pressure,
 *     and pausing must still work then); PURGE, OBLITERATE and FORGET free
 *     memory and are not deny-oom.  RETRYDEAD, PURGE, OBLITERATE (up to
 *     <limit> each) and FORGET (one row per id) are not `fast`.
 * Keys: first, last, step of the declared key arguments (rows and metrics
 * derived from <base> are not declared: emq_keys.h). */
typedef struct {
    const char *name;
    RedisModuleCmdFunc handler;
    const char *flags;
    int first_key, last_key, key_step;
} EmqCommand;

static const EmqCommand commands[] = {
    {"emq.extend", EmqExtend_RedisCommand, "write fast", 1, 2, 1},
    {"emq.checkpoint", EmqCheckpoint_RedisCommand, "write fast", 1, 2, 1},
    {"emq.sweep", EmqSweep_RedisCommand, "write deny-oom", 1, 3, 1},
    {"emq.enqueue", EmqEnqueue_RedisCommand, "write deny-oom fast", 1, 1, 1},
    {"emq.claim", EmqClaim_RedisCommand, "write deny-oom fast", 1, 2, 1},
    {"emq.complete", EmqComplete_RedisCommand, "write fast", 1, 2, 1},
    {"emq.fail", EmqFail_RedisCommand, "write deny-oom fast", 1, 3, 1},
    {"emq.release", EmqRelease_RedisCommand, "write fast", 1, 2, 1},
    {"emq.cancel", EmqCancel_RedisCommand, "write deny-oom fast", 1, 1, 1},
    {"emq.retry", EmqRetry_RedisCommand, "write deny-oom fast", 1, 2, 1},
    {"emq.retrydead", EmqRetryDead_RedisCommand, "write deny-oom", 1, 2, 1},
    {"emq.purge", EmqPurge_RedisCommand, "write", 1, 1, 1},
    {"emq.retention", EmqRetention_RedisCommand, "write deny-oom fast", 1, 1, 1},
    {"emq.pause", EmqPause_RedisCommand, "write fast", 1, 1, 1},
    {"emq.resume", EmqResume_RedisCommand, "write fast", 1, 1, 1},
    {"emq.obliterate", EmqObliterate_RedisCommand, "write", 1, 3, 1},
    {"emq.forget", EmqForget_RedisCommand, "write", 1, 1, 1},
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
}

/* -- loading --------------------------------------------------------------- */

/* What each optional API function is for, so that a server older than the
 * API says in its log exactly what falls back (the module still loads). */
static const char *fallback_of(const char *fn) {
    if (strcmp(fn, "IsModuleNameBusy") == 0)
        return "a second module named 'emq' is not detected at load time";
    return "EMQ.SWEEP, ENQUEUE, CLAIM, FAIL and CANCEL cannot check the job rows and the "
           "metric they derive from <base> against the caller's ACL key permissions (the "
           "declared keys are still checked by the server)";
}

static void log_fallbacks(RedisModuleCtx *ctx) {
    const char *const *missing = emq_rm_missing_optional();
    for (size_t i = 0; missing[i]; i++)
        RedisModule_Log(ctx, "warning", "this server has no RedisModule_%s; falling back: %s",
                        missing[i], fallback_of(missing[i]));
    if (missing[0] == NULL)
        RedisModule_Log(ctx, "notice", "loaded; every optional module API function was found");
}

EMQ_EXPORT int RedisModule_OnLoad(RedisModuleCtx *ctx, RedisModuleString **argv, int argc) {
    (void)argv;
    (void)argc;
    if (emq_rm_init(ctx, "emq", EMQ_MODULE_VERSION) != REDISMODULE_OK) return REDISMODULE_ERR;
    /* A key opened for writing is signalled as modified only when a verb
     * really changed it (emq_key_close): an error or a no-op must not abort
     * other clients' WATCH or invalidate their client-side caches. */
    RedisModule_SetModuleOptions(ctx, REDISMODULE_OPTION_NO_IMPLICIT_SIGNAL_MODIFIED);
    create_strings();
    for (size_t i = 0; i < sizeof commands / sizeof *commands; i++) {
        const EmqCommand *c = &commands[i];
        if (RedisModule_CreateCommand(ctx, c->name, c->handler, c->flags, c->first_key, c->last_key,
                                      c->key_step) != REDISMODULE_OK) {
            /* The server unloads nothing of a module whose OnLoad failed:
             * what we made so far is ours to free. */
            free_strings();
            return REDISMODULE_ERR;
        }
    }
    log_fallbacks(ctx);
    return REDISMODULE_OK;
}

EMQ_EXPORT int RedisModule_OnUnload(RedisModuleCtx *ctx) {
    (void)ctx;
    emq_keys_unload();
    free_strings();
    return REDISMODULE_OK;
}
