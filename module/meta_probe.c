/* meta_probe.c -- a module that only declares; never shipped.
 *
 * tests/verbs/test_metadata.py loads it to see that every kind of argument a table
 * row can declare (emq_meta.h) is accepted by the server and shown by
 * COMMAND DOCS and COMMAND INFO as intended, before a real verb relies on
 * it: optional tokens, a choice, a bare flag, a repeated group. */
#include "emq_meta.h"

static int Demo_RedisCommand(RedisModuleCtx *ctx, RedisModuleString **argv, int argc) {
    (void)argv;
    return RedisModule_ReplyWithLongLong(ctx, argc);
}

static const EmqCommand demo = {
    "emqprobe.demo", Demo_RedisCommand, "write fast",
    .summary = "Declares one argument of every kind",
    .complexity = "O(1)",
    .since = "0.1.0",
    .tips = "nondeterministic_output",
    .categories = "keyspace",
    .args = EMQ_ARGS(EMQ_ARG_KEY("pending", EMQ_RW | EMQ_ACCESS | EMQ_DELETE),
                     EMQ_ARG_KEY("active", EMQ_RW | EMQ_INSERT), EMQ_ARG_BASE, EMQ_ARG("lease-ms", EMQ_INTEGER),
                     EMQ_OPTION("COUNT", "count", EMQ_INTEGER), EMQ_OPTION("BLOCK", "ms", EMQ_INTEGER),
                     EMQ_ONE_OF("when", EMQ_CHOICE("DELAY", "ms", EMQ_INTEGER),
                                EMQ_CHOICE("AT", "unix-time-ms", EMQ_UNIX_TIME)),
                     EMQ_FLAG("NOW"),
                     EMQ_REPEATED("job", EMQ_ARG("id", EMQ_STRING), EMQ_ARG("payload", EMQ_STRING))),
};

__attribute__((visibility("default"))) int RedisModule_OnLoad(RedisModuleCtx *ctx, RedisModuleString **argv,
                                                              int argc) {
    (void)argv;
    (void)argc;
    EmqMetaSupport support;
    if (emq_rm_init(ctx, "emqprobe", 1) != REDISMODULE_OK) return REDISMODULE_ERR;
    if (emq_meta_prepare(ctx, &support) != REDISMODULE_OK) return REDISMODULE_ERR;
    return emq_meta_register(ctx, &demo, &support);
}
