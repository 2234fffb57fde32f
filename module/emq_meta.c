/* emq_meta.c -- see emq_meta.h: a row of the command table, told to the
 * server with whatever its module API offers. */
#include "emq_meta.h"

#include <string.h>

/* -- what the row implies ------------------------------------------------- */

static int is_positional(const EmqArg *a) {
    return !(a->flags & (REDISMODULE_CMD_ARG_OPTIONAL | REDISMODULE_CMD_ARG_MULTIPLE));
}

static size_t count_args(const EmqArg *args) {
    size_t n = 0;
    while (args && args[n].name) n++;
    return n;
}

/* The fewest words an argument takes on the command line (0 when it may be
 * left out), and whether it may take more. */
static int min_words(const EmqArg *a);

static int min_words_of_group(const EmqArg *a) {
    int words = 0, fewest = -1;
    for (const EmqArg *s = a->subargs; s && s->name; s++) {
        int w = min_words(s);
        if (a->type == EMQ_BLOCK) words += w;
        else if (fewest < 0 || w < fewest) fewest = w;
    }
    return a->type == EMQ_BLOCK ? words : (fewest < 0 ? 0 : fewest);
}

static int min_words(const EmqArg *a) {
    if (a->flags & REDISMODULE_CMD_ARG_OPTIONAL) return 0;
    int words = a->token && a->type != EMQ_TOKEN ? 1 : 0;
    if (a->type == EMQ_BLOCK || a->type == EMQ_ONEOF) return words + min_words_of_group(a);
    return words + 1;
}

static int is_variable(const EmqArg *a) {
    if (!is_positional(a)) return 1;
    if (a->type != EMQ_BLOCK && a->type != EMQ_ONEOF) return 0;
    int first = -1;
    for (const EmqArg *s = a->subargs; s && s->name; s++) {
        if (is_variable(s)) return 1;
        int w = min_words(s);
        if (a->type == EMQ_ONEOF && first >= 0 && w != first) return 1;
        first = w;
    }
    return 0;
}

int emq_meta_arity(const EmqCommand *cmd) {
    int words = 1, variable = 0;
    for (const EmqArg *a = cmd->args; a && a->name; a++) {
        words += min_words(a);
        variable |= is_variable(a);
    }
    return variable ? -words : words;
}

static void append(char *buf, size_t size, const char *word) {
    size_t used = strlen(buf);
    if (used + 1 + strlen(word) + 1 > size) return;
    if (used) buf[used++] = ' ';
    strcpy(buf + used, word);
}

static int has_flag(const char *flags, const char *flag) {
    size_t n = strlen(flag);
    for (const char *p = flags; (p = strstr(p, flag)) != NULL; p += n)
        if ((p == flags || p[-1] == ' ') && (p[n] == ' ' || p[n] == '\0')) return 1;
    return 0;
}

void emq_meta_categories(const EmqCommand *cmd, const EmqMetaSupport *support, char *buf, size_t size) {
    buf[0] = '\0';
    /* What the core commands' flags imply for their categories. */
    if (has_flag(cmd->flags, "write")) append(buf, size, "write");
    if (has_flag(cmd->flags, "readonly")) append(buf, size, "read");
    append(buf, size, has_flag(cmd->flags, "fast") ? "fast" : "slow");
    if (has_flag(cmd->flags, "blocking")) append(buf, size, "blocking");
    if (has_flag(cmd->flags, "admin")) append(buf, size, "admin dangerous");
    if (support->own_category) append(buf, size, "emq");
    if (cmd->categories) append(buf, size, cmd->categories);
}

/* The key arguments' span, for the legacy first/last/step every server
 * reads (6.2 has nothing else; <base> is not part of it).  A key argument
 * must have a fixed position (no optional, repeated or token argument
 * before it) and the keys must be adjacent; a row that breaks this is
 * refused at load, and the tests load every row. */
static int key_span(const EmqCommand *cmd, int *first, int *last) {
    *first = *last = 0;
    int pos = 0;
    for (const EmqArg *a = cmd->args; a && a->name; a++) {
        pos++;
        if (a->type != EMQ_KEY && a->type != EMQ_BASE) continue;
        for (const EmqArg *b = cmd->args; b != a; b++)
            if (!is_positional(b) || b->token || b->type == EMQ_BLOCK || b->type == EMQ_ONEOF) return 0;
        if (a->type == EMQ_BASE) continue;
        if (*last && *last != pos - 1) return 0;
        if (!*first) *first = pos;
        *last = pos;
    }
    return 1;
}

/* -- the module API's structures ------------------------------------------ */

static const RedisModuleCommandInfoVersion info_version = {
    .version = 1,
    .sizeof_historyentry = sizeof(RedisModuleCommandHistoryEntry),
    .sizeof_keyspec = sizeof(RedisModuleCommandKeySpec),
    .sizeof_arg = sizeof(RedisModuleCommandArg),
};

static const char BASE_NOTES[] =
    "not a key: the prefix of the job rows (<base>job:<id>) and the metrics (<base>metrics:failed) "
    "the command derives and checks against the caller's ACL itself; routed like a key";

static void free_args(RedisModuleCommandArg *args) {
    if (args == NULL) return;
    for (RedisModuleCommandArg *a = args; a->name; a++) free_args(a->subargs);
    RedisModule_Free(args);
}

/* A zeroed array of the row's arguments in the API's form (NULL-name
 * terminated); key_spec counts the key specs handed out so far. */
static RedisModuleCommandArg *make_args(const EmqArg *args, int *key_spec) {
    size_t n = count_args(args);
    RedisModuleCommandArg *out = RedisModule_Alloc((n + 1) * sizeof *out);
    memset(out, 0, (n + 1) * sizeof *out);
    for (size_t i = 0; i < n; i++) {
        const EmqArg *a = &args[i];
        RedisModuleCommandArg *o = &out[i];
        o->name = a->name;
        o->token = a->token;
        o->flags = a->flags;
        o->key_spec_index = -1;
        if (a->type == EMQ_KEY) {
            o->type = REDISMODULE_ARG_TYPE_KEY;
            o->key_spec_index = (*key_spec)++;
        } else if (a->type == EMQ_BASE) {
            o->type = REDISMODULE_ARG_TYPE_STRING;
            (*key_spec)++;
        } else {
            o->type = (RedisModuleCommandArgType)a->type;
        }
        if (a->subargs) o->subargs = make_args(a->subargs, key_spec);
    }
    return out;
}

/* One key spec per KEY and BASE argument, in order, each a single key at
 * its position (keys are positional: key_span checked it). */
static RedisModuleCommandKeySpec *make_key_specs(const EmqCommand *cmd) {
    size_t n = count_args(cmd->args);
    RedisModuleCommandKeySpec *specs = RedisModule_Alloc((n + 1) * sizeof *specs);
    memset(specs, 0, (n + 1) * sizeof *specs);
    size_t k = 0;
    for (size_t i = 0; i < n; i++) {
        const EmqArg *a = &cmd->args[i];
        if (a->type != EMQ_KEY && a->type != EMQ_BASE) continue;
        RedisModuleCommandKeySpec *s = &specs[k++];
        s->flags = a->type == EMQ_BASE ? (REDISMODULE_CMD_KEY_RO | REDISMODULE_CMD_KEY_NOT_KEY) : a->key_flags;
        s->notes = a->type == EMQ_BASE ? BASE_NOTES : NULL;
        s->begin_search_type = REDISMODULE_KSPEC_BS_INDEX;
        s->bs.index.pos = (int)i + 1;
        s->find_keys_type = REDISMODULE_KSPEC_FK_RANGE;
        s->fk.range.lastkey = 0;
        s->fk.range.keystep = 1;
        s->fk.range.limit = 0;
    }
    return specs;
}

/* -- registering ------------------------------------------------------------ */

int emq_meta_prepare(RedisModuleCtx *ctx, EmqMetaSupport *support) {
    support->info = RedisModule_GetCommand && RedisModule_SetCommandInfo;
    support->categories = RedisModule_GetCommand && RedisModule_SetCommandACLCategories;
    support->own_category = 0;
    if (support->categories && RedisModule_AddACLCategory) {
        /* A category outlives MODULE UNLOAD: after a reload @emq is there
         * already and the server refuses to add it again.  The commands
         * join it all the same (SetCommandACLCategories fails, logged, if
         * it really is missing). */
        if (RedisModule_AddACLCategory(ctx, "emq") != REDISMODULE_OK)
            RedisModule_Log(ctx, "notice", "the ACL category @emq exists already (an earlier load of "
                                           "this module, or another module, added it); the commands join it");
        support->own_category = 1;
    }
    return REDISMODULE_OK;
}

int emq_meta_register(RedisModuleCtx *ctx, const EmqCommand *cmd, const EmqMetaSupport *support) {
    int first, last;
    if (!key_span(cmd, &first, &last)) {
        RedisModule_Log(ctx, "warning", "not loaded: the table row of %s has key arguments that are not "
                                        "adjacent and first (module/emq_meta.h)", cmd->name);
        return REDISMODULE_ERR;
    }
    if (RedisModule_CreateCommand(ctx, cmd->name, cmd->handler, cmd->flags, first, last, first ? 1 : 0) !=
        REDISMODULE_OK) {
        RedisModule_Log(ctx, "warning", "not loaded: the server refused to create the command %s "
                                        "(is another module's command of that name loaded?)", cmd->name);
        return REDISMODULE_ERR;
    }
    RedisModuleCommand *command = support->info || support->categories ? RedisModule_GetCommand(ctx, cmd->name)
                                                                        : NULL;
    if (support->info) {
        int key_spec = 0;
        RedisModuleCommandInfo info = {
            .version = &info_version,
            .summary = cmd->summary,
            .complexity = cmd->complexity,
            .since = cmd->since,
            .tips = cmd->tips,
            .arity = emq_meta_arity(cmd),
            .key_specs = make_key_specs(cmd),
            .args = make_args(cmd->args, &key_spec),
        };
        int ok = command && RedisModule_SetCommandInfo(command, &info) == REDISMODULE_OK;
        RedisModule_Free(info.key_specs);
        free_args(info.args);
        if (!ok) {
            RedisModule_Log(ctx, "warning", "not loaded: the server refused the command info of %s", cmd->name);
            return REDISMODULE_ERR;
        }
    }
    if (support->categories) {
        char categories[256];
        emq_meta_categories(cmd, support, categories, sizeof categories);
        if (!command || RedisModule_SetCommandACLCategories(command, categories) != REDISMODULE_OK) {
            RedisModule_Log(ctx, "warning", "not loaded: the server refused the ACL categories '%s' of %s",
                            categories, cmd->name);
            return REDISMODULE_ERR;
        }
    }
    return REDISMODULE_OK;
}
