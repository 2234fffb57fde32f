/* memcheck_canary.c -- a module that is wrong on purpose; never shipped.
 *
 * `make check` first runs this under the memory checker and insists that the
 * checker reports both of its faults against this .so.  A run that finds
 * nothing wrong with emq.so means something only if the same run can find
 * a module's leak and a module's stray read: jemalloc hidden from valgrind,
 * a server killed before it wrote its leak report, or a log the parser
 * misreads would all turn the real check into a silent pass. */
#include <stddef.h>

#include "emq_rm.h"

/* A string created and dropped: a definite leak, allocated from this .so. */
static int Leak_RedisCommand(RedisModuleCtx *ctx, RedisModuleString **argv, int argc) {
    (void)argv;
    (void)argc;
    RedisModule_CreateString(ctx, "canary", 6);
    return RedisModule_ReplyWithLongLong(ctx, 1);
}

/* One byte read past the end of a heap block. */
static int Overread_RedisCommand(RedisModuleCtx *ctx, RedisModuleString **argv, int argc) {
    (void)argv;
    size_t size = 8;
    unsigned char *block = RedisModule_Alloc(size);
    for (size_t i = 0; i < size; i++) block[i] = (unsigned char)i;
    /* argc is 1 here; the compiler cannot prove the index is out of bounds. */
    volatile size_t past = size - 1 + (size_t)argc;
    long long value = block[past];
    RedisModule_Free(block);
    return RedisModule_ReplyWithLongLong(ctx, value);
}

__attribute__((visibility("default"))) int RedisModule_OnLoad(RedisModuleCtx *ctx,
                                                              RedisModuleString **argv, int argc) {
    (void)argv;
    (void)argc;
    if (emq_rm_init(ctx, "emqcanary", 1) != REDISMODULE_OK) return REDISMODULE_ERR;
    if (RedisModule_CreateCommand(ctx, "emqcanary.leak", Leak_RedisCommand, "readonly", 0, 0, 0) !=
        REDISMODULE_OK)
        return REDISMODULE_ERR;
    if (RedisModule_CreateCommand(ctx, "emqcanary.overread", Overread_RedisCommand, "readonly", 0,
                                  0, 0) != REDISMODULE_OK)
        return REDISMODULE_ERR;
    return REDISMODULE_OK;
}
