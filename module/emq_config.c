/* emq_config.c -- see emq_config.h. */
#include "emq_config.h"

#include <string.h>

#include "emq_core.h"
#include "emq_schedules.h"

typedef struct {
    const char *name; /* without the module's "emq." */
    long long value, def;
    long long min, max;
    unsigned int flags; /* REDISMODULE_CONFIG_* */
    int seen;           /* given as a load argument */
} EmqSetting;

/* max-limit: 10000 jobs is about 25 ms of one SWEEP on the machine that ran
 * bench/RESULTS.md (2.2-2.5 us per swept job), and about 70 ms at the rate of
 * the 200,000-job sweep that blocked a server for 1.4 s: a pause clients
 * survive, 100 times the Reaper's own batch of 100.  Each setting has a
 * ceiling the verbs are tested at (emq_core.h); the server refuses a CONFIG
 * SET beyond it, and a load argument beyond it refuses the load. */
enum { MAX_LIMIT, MAX_STATE_BYTES, MAX_PAYLOAD_BYTES, MAX_RESULT_BYTES, SETTINGS };
static EmqSetting settings[SETTINGS] = {
    [MAX_LIMIT] = {"max-limit", 10000, 10000, 1, EMQ_MAX_LIMIT_CEILING, REDISMODULE_CONFIG_DEFAULT, 0},
    [MAX_STATE_BYTES] = {"max-state-bytes", 65536, 65536, 0, EMQ_MAX_STATE_BYTES_CEILING, REDISMODULE_CONFIG_MEMORY,
                         0},
    [MAX_PAYLOAD_BYTES] = {"max-payload-bytes", EMQ_DEFAULT_MAX_PAYLOAD_BYTES, EMQ_DEFAULT_MAX_PAYLOAD_BYTES, 0,
                           EMQ_MAX_PAYLOAD_BYTES_CEILING, REDISMODULE_CONFIG_MEMORY, 0},
    [MAX_RESULT_BYTES] = {"max-result-bytes", EMQ_DEFAULT_MAX_RESULT_BYTES, EMQ_DEFAULT_MAX_RESULT_BYTES, 0,
                          EMQ_MAX_RESULT_BYTES_CEILING, REDISMODULE_CONFIG_MEMORY, 0},
};
static int live;

/* schedule-timer: whether the server fires due schedule ticks itself
 * (emq_schedules.h).  A yes/no, so not in the numeric table above. */
static int schedule_timer = 1, schedule_timer_seen;

int emq_config_schedule_timer(void) {
    return schedule_timer;
}

long long emq_config_max_limit(void) {
    return settings[MAX_LIMIT].value;
}

long long emq_config_max_state_bytes(void) {
    return settings[MAX_STATE_BYTES].value;
}

long long emq_config_max_payload_bytes(void) {
    return settings[MAX_PAYLOAD_BYTES].value;
}

long long emq_config_max_result_bytes(void) {
    return settings[MAX_RESULT_BYTES].value;
}

int emq_config_is_live(void) {
    return live;
}

static EmqSetting *find(const char *name, size_t len) {
    for (int i = 0; i < SETTINGS; i++)
        if (strlen(settings[i].name) == len && memcmp(settings[i].name, name, len) == 0) return &settings[i];
    return NULL;
}

int emq_config_load_args(RedisModuleCtx *ctx, RedisModuleString **argv, int argc) {
    /* A reload may find this file's memory as the last load left it. */
    for (int i = 0; i < SETTINGS; i++) {
        settings[i].value = settings[i].def;
        settings[i].seen = 0;
    }
    schedule_timer = 1;
    schedule_timer_seen = 0;
    for (int i = 0; i < argc; i += 2) {
        size_t len, vlen = 0;
        const char *name = RedisModule_StringPtrLen(argv[i], &len);
        if (len == 14 && memcmp(name, "schedule-timer", 14) == 0) {
            const char *value = i + 1 < argc ? RedisModule_StringPtrLen(argv[i + 1], &vlen) : NULL;
            int yes = value && vlen == 3 && memcmp(value, "yes", 3) == 0;
            int no = value && vlen == 2 && memcmp(value, "no", 2) == 0;
            if (schedule_timer_seen || !(yes || no)) {
                RedisModule_Log(ctx, "warning",
                                schedule_timer_seen ? "not loaded: the load argument schedule-timer is given twice"
                                                    : "not loaded: the load argument schedule-timer needs yes or no");
                return REDISMODULE_ERR;
            }
            schedule_timer = yes;
            schedule_timer_seen = 1;
            continue;
        }
        EmqSetting *s = find(name, len);
        if (s == NULL) {
            RedisModule_Log(ctx, "warning",
                            "not loaded: unknown load argument '%.*s' (emq.so takes: max-limit <n>, "
                            "max-state-bytes <n>, max-payload-bytes <n>, max-result-bytes <n>, "
                            "schedule-timer yes|no)",
                            (int)(len > 200 ? 200 : len), name);
            return REDISMODULE_ERR;
        }
        if (s->seen) {
            RedisModule_Log(ctx, "warning", "not loaded: the load argument %s is given twice", s->name);
            return REDISMODULE_ERR;
        }
        const char *value = i + 1 < argc ? RedisModule_StringPtrLen(argv[i + 1], &vlen) : NULL;
        long long v;
        if (value == NULL || emq_parse_ll(value, vlen, &v) != 0 || v < s->min || v > s->max) {
            RedisModule_Log(ctx, "warning",
                            "not loaded: the load argument %s needs an integer from %lld to %lld, got '%.*s'",
                            s->name, s->min, s->max, (int)(vlen > 200 ? 200 : vlen), value ? value : "");
            return REDISMODULE_ERR;
        }
        s->value = v;
        s->seen = 1;
    }
    return REDISMODULE_OK;
}

static long long get_setting(const char *name, void *privdata) {
    (void)name;
    return ((EmqSetting *)privdata)->value;
}

static int set_setting(const char *name, long long value, void *privdata, RedisModuleString **err) {
    (void)name;
    (void)err; /* the server enforces min and max itself */
    ((EmqSetting *)privdata)->value = value;
    return REDISMODULE_OK;
}

static int get_schedule_timer(const char *name, void *privdata) {
    (void)name;
    (void)privdata;
    return schedule_timer;
}

static int set_schedule_timer(const char *name, int value, void *privdata, RedisModuleString **err) {
    (void)name;
    (void)privdata;
    (void)err;
    schedule_timer = value != 0;
    emq_schedules_setting_changed();
    return REDISMODULE_OK;
}

int emq_config_register(RedisModuleCtx *ctx) {
    live = 0;
    if (!RedisModule_RegisterNumericConfig || !RedisModule_LoadConfigs || !RedisModule_RegisterBoolConfig)
        return REDISMODULE_OK;
    for (int i = 0; i < SETTINGS; i++) {
        EmqSetting *s = &settings[i];
        if (RedisModule_RegisterNumericConfig(ctx, s->name, s->value, s->flags, s->min, s->max, get_setting,
                                              set_setting, NULL, s) != REDISMODULE_OK) {
            RedisModule_Log(ctx, "warning", "not loaded: the server refused the config emq.%s", s->name);
            return REDISMODULE_ERR;
        }
    }
    if (RedisModule_RegisterBoolConfig(ctx, "schedule-timer", schedule_timer, REDISMODULE_CONFIG_DEFAULT,
                                       get_schedule_timer, set_schedule_timer, NULL, NULL) != REDISMODULE_OK) {
        RedisModule_Log(ctx, "warning", "not loaded: the server refused the config emq.schedule-timer");
        return REDISMODULE_ERR;
    }
    /* The config file's, the command line's or MODULE LOADEX's values. */
    if (RedisModule_LoadConfigs(ctx) != REDISMODULE_OK) {
        RedisModule_Log(ctx, "warning", "not loaded: a value given for an emq.* config was refused "
                                        "(the line above says which)");
        return REDISMODULE_ERR;
    }
    live = 1;
    return REDISMODULE_OK;
}
