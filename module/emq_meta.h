/* emq_meta.h -- what the server is told about each command: one row of the
 * command table (emq.c) says everything, and emq_meta.c turns it
 * into the module API's calls.
 *
 * A row names the command, its handler and its flags, a summary, the
 * complexity, the module version it came with, and its arguments in order.
 * Everything else is derived from those, so it cannot disagree with them:
 *
 *   - the arity: the required arguments plus the name, negative as soon as
 *     one argument is optional or repeats;
 *   - the key specs: one per key argument, at its position, with the flags
 *     the row gives it (what the verb does to that key);
 *   - the legacy first/last/step for servers without key specs: the span of
 *     the key arguments (which must therefore come first and be adjacent);
 *   - the ACL categories: @write / @read / @fast or @slow / @blocking /
 *     @admin from the flags, plus @emq where the server lets a module add a
 *     category.
 *
 * Adding a verb: one row.  Adding an optional argument: one line in its
 * row, e.g. EMQ_OPTION("COUNT", "count", EMQ_INTEGER) for `[COUNT count]`. */
#ifndef EMQ_META_H
#define EMQ_META_H

#include "emq_rm.h"

/* The kinds of argument.  KEY is a key the verb touches, with key-spec
 * flags; BASE is <base>, the prefix the verb derives job rows and metrics
 * from: not a key, but routed like one (a NOT_KEY key spec), so a cluster
 * client sends the command to the node of the queue's slot. */
typedef enum {
    EMQ_STRING = REDISMODULE_ARG_TYPE_STRING,
    EMQ_INTEGER = REDISMODULE_ARG_TYPE_INTEGER,
    EMQ_UNIX_TIME = REDISMODULE_ARG_TYPE_UNIX_TIME,
    EMQ_TOKEN = REDISMODULE_ARG_TYPE_PURE_TOKEN,
    EMQ_ONEOF = REDISMODULE_ARG_TYPE_ONEOF,
    EMQ_BLOCK = REDISMODULE_ARG_TYPE_BLOCK,
    EMQ_KEY = REDISMODULE_ARG_TYPE_KEY,
    EMQ_BASE = 100
} EmqArgType;

typedef struct EmqArg {
    const char *name;
    EmqArgType type;
    const char *token;   /* the literal word before the value ("COUNT"), or NULL */
    int flags;           /* REDISMODULE_CMD_ARG_OPTIONAL / _MULTIPLE */
    uint64_t key_flags;  /* KEY: REDISMODULE_CMD_KEY_*, what the verb does to it */
    const struct EmqArg *subargs; /* ONEOF and BLOCK: ends with a NULL name */
} EmqArg;

/* Key-spec flags, short.  One of RO/RW/OW/RM, at most one of INSERT/
 * UPDATE/DELETE, plus ACCESS when the verb reads or returns the key's data
 * (a %W~ user may run a verb whose keys are all written blind). */
#define EMQ_RO REDISMODULE_CMD_KEY_RO
#define EMQ_RW REDISMODULE_CMD_KEY_RW
#define EMQ_OW REDISMODULE_CMD_KEY_OW
#define EMQ_RM REDISMODULE_CMD_KEY_RM
#define EMQ_ACCESS REDISMODULE_CMD_KEY_ACCESS
#define EMQ_INSERT REDISMODULE_CMD_KEY_INSERT
#define EMQ_UPDATE REDISMODULE_CMD_KEY_UPDATE
#define EMQ_DELETE REDISMODULE_CMD_KEY_DELETE

/* Positional arguments. */
#define EMQ_ARG_KEY(name, key_flags) {(name), EMQ_KEY, NULL, 0, (key_flags), NULL}
#define EMQ_ARG_BASE {"base", EMQ_BASE, NULL, 0, 0, NULL}
#define EMQ_ARG(name, type) {(name), (type), NULL, 0, 0, NULL}
/* `[TOKEN name]`, e.g. EMQ_OPTION("COUNT", "count", EMQ_INTEGER). */
#define EMQ_OPTION(token, name, type) {(name), (type), (token), REDISMODULE_CMD_ARG_OPTIONAL, 0, NULL}
/* `[TOKEN name [name ...]]`: the token once, then one value or more. */
#define EMQ_OPTION_MANY(token, name, type) \
    {(name), (type), (token), REDISMODULE_CMD_ARG_OPTIONAL | REDISMODULE_CMD_ARG_MULTIPLE, 0, NULL}
/* `[TOKEN]` alone. */
#define EMQ_FLAG(token) {(token), EMQ_TOKEN, (token), REDISMODULE_CMD_ARG_OPTIONAL, 0, NULL}
/* One alternative of a choice: `TOKEN name`. */
#define EMQ_CHOICE(token, name, type) {(name), (type), (token), 0, 0, NULL}
/* `[A a | B b]`: at most one of the EMQ_CHOICE()s given. */
#define EMQ_ONE_OF(name, ...) \
    {(name), EMQ_ONEOF, NULL, REDISMODULE_CMD_ARG_OPTIONAL, 0, (const EmqArg[]){__VA_ARGS__, {0}}}
/* `a b [a b ...]`: a group given once or more. */
#define EMQ_REPEATED(name, ...) \
    {(name), EMQ_BLOCK, NULL, REDISMODULE_CMD_ARG_MULTIPLE, 0, (const EmqArg[]){__VA_ARGS__, {0}}}
/* The argument list of a row. */
#define EMQ_ARGS(...) ((const EmqArg[]){__VA_ARGS__, {0}})

typedef struct {
    const char *name; /* lower case, "emq.<verb>" */
    RedisModuleCmdFunc handler;
    const char *flags; /* CreateCommand's flags: "write deny-oom fast" */
    const char *summary;
    const char *complexity;
    const char *since; /* the module version that brought it */
    const EmqArg *args;
    const char *tips;       /* optional: hints for clients, "nondeterministic_output" */
    const char *categories; /* optional: ACL categories beyond the derived ones */
} EmqCommand;

/* What this server supports, decided once at load (emq_meta_prepare). */
typedef struct {
    int info;       /* SetCommandInfo: arity, key specs, docs */
    int categories; /* SetCommandACLCategories */
    int own_category; /* @emq was added */
} EmqMetaSupport;

/* Add the @emq category where the server can; fill `support`.  Returns
 * REDISMODULE_OK, or ERR after logging why. */
int emq_meta_prepare(RedisModuleCtx *ctx, EmqMetaSupport *support);

/* Register one command with everything the server can take.  Returns
 * REDISMODULE_OK, or ERR after logging which command and why. */
int emq_meta_register(RedisModuleCtx *ctx, const EmqCommand *cmd, const EmqMetaSupport *support);

/* The arity the server is told (counts the name; -N: at least N). */
int emq_meta_arity(const EmqCommand *cmd);

/* The ACL categories the server is told, space-separated, into buf. */
void emq_meta_categories(const EmqCommand *cmd, const EmqMetaSupport *support, char *buf, size_t size);

#endif
