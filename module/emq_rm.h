/* emq_rm.h -- the slice of the Redis module API that emq.so uses.
 *
 * Written for this project from the documented module API (the "Modules API
 * reference"): only the types, constants and functions we call.  A module
 * receives the API as function pointers: the server hands a lookup function
 * to RedisModule_OnLoad inside the context, and each pointer below is filled
 * by name at load time (emq_rm_init).  Functions newer than Redis 7.0 are
 * "optional": their pointer stays NULL on an older server and the caller
 * checks before using it. */
#ifndef EMQ_RM_H
#define EMQ_RM_H

#include <stddef.h>
#include <stdint.h>

#define REDISMODULE_OK 0
#define REDISMODULE_ERR 1
#define REDISMODULE_APIVER_1 1

/* OpenKey modes. */
#define REDISMODULE_READ (1 << 0)
#define REDISMODULE_WRITE (1 << 1)

/* KeyType() answers. */
#define REDISMODULE_KEYTYPE_EMPTY 0
#define REDISMODULE_KEYTYPE_STRING 1
#define REDISMODULE_KEYTYPE_LIST 2
#define REDISMODULE_KEYTYPE_HASH 3
#define REDISMODULE_KEYTYPE_ZSET 5

/* ListPush()/ListPop(): which end. */
#define REDISMODULE_LIST_HEAD 0
#define REDISMODULE_LIST_TAIL 1

/* ZsetAdd() input and output flags. */
#define REDISMODULE_ZADD_XX (1 << 0)
#define REDISMODULE_ZADD_ADDED (1 << 2)
#define REDISMODULE_ZADD_UPDATED (1 << 3)
#define REDISMODULE_ZADD_NOP (1 << 4)

/* HashGet()/HashSet() flags: CFIELDS means field names are C strings. */
#define REDISMODULE_HASH_NONE 0
#define REDISMODULE_HASH_CFIELDS (1 << 2)
#define REDISMODULE_HASH_EXISTS (1 << 3)
/* A HashSet() value that deletes the field. */
#define REDISMODULE_HASH_DELETE ((RedisModuleString *)(long)1)

/* GetExpire()/SetExpire(): no expiry. */
#define REDISMODULE_NO_EXPIRE (-1)

/* StringDMA() access mode. */
#define REDISMODULE_STRING_DMA_READ REDISMODULE_READ

/* SetModuleOptions(): the module says itself which keys it modified. */
#define REDISMODULE_OPTION_NO_IMPLICIT_SIGNAL_MODIFIED (1 << 1)

/* GetContextFlags() bits. */
#define REDISMODULE_CTX_FLAGS_LUA (1 << 0)
#define REDISMODULE_CTX_FLAGS_MULTI (1 << 1)
#define REDISMODULE_CTX_FLAGS_MASTER (1 << 2)
#define REDISMODULE_CTX_FLAGS_CLUSTER (1 << 5)
#define REDISMODULE_CTX_FLAGS_OOM (1 << 10)
#define REDISMODULE_CTX_FLAGS_REPLICATED (1 << 12)
#define REDISMODULE_CTX_FLAGS_LOADING (1 << 13)
#define REDISMODULE_CTX_FLAGS_DENY_BLOCKING (1 << 21)

/* NotifyKeyspaceEvent() classes. */
#define REDISMODULE_NOTIFY_GENERIC (1 << 2)
#define REDISMODULE_NOTIFY_STRING (1 << 3)
#define REDISMODULE_NOTIFY_LIST (1 << 4)
#define REDISMODULE_NOTIFY_HASH (1 << 6)
#define REDISMODULE_NOTIFY_ZSET (1 << 7)

/* CallReplyType() answers (the ones we look at). */
#define REDISMODULE_REPLY_STRING 0
#define REDISMODULE_REPLY_ERROR 1
#define REDISMODULE_REPLY_ARRAY 3

/* Server events (SubscribeToServerEvent): an event is its id and the
 * version of the data its callback receives. */
typedef struct {
    uint64_t id;
    uint64_t dataver;
} RedisModuleEvent;
#define REDISMODULE_EVENT_REPLICATION_ROLE_CHANGED 0
#define REDISMODULE_EVENT_FLUSHDB 2
#define REDISMODULE_EVENT_LOADING 3
#define REDISMODULE_EVENT_SWAPDB 11
/* Their subevents. */
#define REDISMODULE_EVENT_REPLROLECHANGED_NOW_MASTER 0
#define REDISMODULE_SUBEVENT_FLUSHDB_END 1
#define REDISMODULE_SUBEVENT_LOADING_RDB_START 0
#define REDISMODULE_SUBEVENT_LOADING_AOF_START 1
#define REDISMODULE_SUBEVENT_LOADING_REPL_START 2
#define REDISMODULE_SUBEVENT_LOADING_ENDED 3
#define REDISMODULE_SUBEVENT_LOADING_FAILED 4
/* FlushDB's data (version 1): dbnum -1 for FLUSHALL. */
typedef struct {
    uint64_t version;
    int32_t sync;
    int32_t dbnum;
} RedisModuleFlushInfo;

/* Key-spec flags (SetCommandInfo), also the ACL check's access flags.
 * Exactly one of RO/RW/OW/RM (how the value is treated), at most one of
 * INSERT/DELETE/UPDATE (what a write does), ACCESS when the command reads
 * or returns the user's data; NOT_KEY marks an argument that is not a key
 * but routes like one in a cluster. */
#define REDISMODULE_CMD_KEY_RO (1ULL << 0)
#define REDISMODULE_CMD_KEY_RW (1ULL << 1)
#define REDISMODULE_CMD_KEY_OW (1ULL << 2)
#define REDISMODULE_CMD_KEY_RM (1ULL << 3)
#define REDISMODULE_CMD_KEY_ACCESS (1ULL << 4)
#define REDISMODULE_CMD_KEY_UPDATE (1ULL << 5)
#define REDISMODULE_CMD_KEY_INSERT (1ULL << 6)
#define REDISMODULE_CMD_KEY_DELETE (1ULL << 7)
#define REDISMODULE_CMD_KEY_NOT_KEY (1ULL << 8)

/* Argument flags (SetCommandInfo). */
#define REDISMODULE_CMD_ARG_NONE 0
#define REDISMODULE_CMD_ARG_OPTIONAL (1 << 0)
#define REDISMODULE_CMD_ARG_MULTIPLE (1 << 1)
#define REDISMODULE_CMD_ARG_MULTIPLE_TOKEN (1 << 2)

/* Argument types (SetCommandInfo). */
typedef enum {
    REDISMODULE_ARG_TYPE_STRING,
    REDISMODULE_ARG_TYPE_INTEGER,
    REDISMODULE_ARG_TYPE_DOUBLE,
    REDISMODULE_ARG_TYPE_KEY,
    REDISMODULE_ARG_TYPE_PATTERN,
    REDISMODULE_ARG_TYPE_UNIX_TIME,
    REDISMODULE_ARG_TYPE_PURE_TOKEN,
    REDISMODULE_ARG_TYPE_ONEOF,
    REDISMODULE_ARG_TYPE_BLOCK
} RedisModuleCommandArgType;

/* How a key spec finds its first key (0 ends an array of key specs) ... */
typedef enum {
    REDISMODULE_KSPEC_BS_INVALID = 0,
    REDISMODULE_KSPEC_BS_UNKNOWN,
    REDISMODULE_KSPEC_BS_INDEX,
    REDISMODULE_KSPEC_BS_KEYWORD
} RedisModuleKeySpecBeginSearchType;

/* ... and the keys from there (OMITTED: exactly one key). */
typedef enum {
    REDISMODULE_KSPEC_FK_OMITTED = 0,
    REDISMODULE_KSPEC_FK_UNKNOWN,
    REDISMODULE_KSPEC_FK_RANGE,
    REDISMODULE_KSPEC_FK_KEYNUM
} RedisModuleKeySpecFindKeysType;

/* Module configuration flags (RegisterNumericConfig).  MEMORY lets a value
 * be given as "64kb" and shown in bytes. */
#define REDISMODULE_CONFIG_DEFAULT 0
#define REDISMODULE_CONFIG_MEMORY (1ULL << 7)

#define REDISMODULE_ERRORMSG_WRONGTYPE \
    "WRONGTYPE Operation against a key holding the wrong kind of value"

typedef struct RedisModuleCtx RedisModuleCtx;
typedef struct RedisModuleKey RedisModuleKey;
typedef struct RedisModuleString RedisModuleString;
typedef struct RedisModuleUser RedisModuleUser;
typedef struct RedisModuleCallReply RedisModuleCallReply;
typedef struct RedisModuleCommand RedisModuleCommand;
typedef struct RedisModuleBlockedClient RedisModuleBlockedClient;
typedef struct RedisModuleDict RedisModuleDict;
typedef struct RedisModuleScanCursor RedisModuleScanCursor;
typedef uint64_t RedisModuleTimerID;
typedef int (*RedisModuleCmdFunc)(RedisModuleCtx *ctx, RedisModuleString **argv, int argc);
typedef void (*RedisModuleTimerProc)(RedisModuleCtx *ctx, void *data);
typedef void (*RedisModuleFreePrivdataFunc)(RedisModuleCtx *ctx, void *privdata);
typedef int (*RedisModuleNotificationFunc)(RedisModuleCtx *ctx, int type, const char *event,
                                           RedisModuleString *key);
typedef void (*RedisModuleEventCallback)(RedisModuleCtx *ctx, RedisModuleEvent eid, uint64_t subevent,
                                         void *data);
typedef void (*RedisModuleScanCB)(RedisModuleCtx *ctx, RedisModuleString *keyname, RedisModuleKey *key,
                                  void *privdata);

/* -- command metadata (SetCommandInfo, Redis 7.0+) ------------------------
 * The server reads these arrays with the element sizes given in the
 * version, so the layouts below must be the documented ones, field for
 * field.  `display_text` came with Redis 7.2; a 7.0 server indexes the
 * arrays by our sizes and never reads it. */

typedef struct RedisModuleCommandArg {
    const char *name;
    RedisModuleCommandArgType type;
    int key_spec_index; /* KEY: the index of its key spec; else -1 */
    const char *token;  /* the literal word before the value, or NULL */
    const char *summary;
    const char *since;
    int flags; /* REDISMODULE_CMD_ARG_* */
    const char *deprecated_since;
    struct RedisModuleCommandArg *subargs; /* ONEOF and BLOCK; ends with a NULL name */
    const char *display_text;
} RedisModuleCommandArg;

typedef struct {
    const char *since;
    const char *changes;
} RedisModuleCommandHistoryEntry;

typedef struct {
    const char *notes;
    uint64_t flags; /* REDISMODULE_CMD_KEY_* */
    RedisModuleKeySpecBeginSearchType begin_search_type;
    union {
        struct {
            int pos;
        } index;
        struct {
            const char *keyword;
            int startfrom;
        } keyword;
    } bs;
    RedisModuleKeySpecFindKeysType find_keys_type;
    union {
        struct {
            int lastkey;
            int keystep;
            int limit;
        } range;
        struct {
            int keynumidx;
            int firstkey;
            int keystep;
        } keynum;
    } fk;
} RedisModuleCommandKeySpec;

typedef struct {
    int version; /* 1 */
    size_t sizeof_historyentry;
    size_t sizeof_keyspec;
    size_t sizeof_arg;
} RedisModuleCommandInfoVersion;

typedef struct {
    const RedisModuleCommandInfoVersion *version;
    const char *summary;
    const char *complexity;
    const char *since;
    RedisModuleCommandHistoryEntry *history;
    const char *tips; /* space-separated */
    int arity;        /* counts the command name; -N: at least N */
    RedisModuleCommandKeySpec *key_specs; /* ends with begin_search_type 0 */
    RedisModuleCommandArg *args;          /* ends with a NULL name */
} RedisModuleCommandInfo;

/* -- module configuration (Redis 7.0+) ------------------------------------ */

typedef long long (*RedisModuleConfigGetNumericFunc)(const char *name, void *privdata);
typedef int (*RedisModuleConfigSetNumericFunc)(const char *name, long long val, void *privdata,
                                               RedisModuleString **err);
typedef int (*RedisModuleConfigGetBoolFunc)(const char *name, void *privdata);
typedef int (*RedisModuleConfigSetBoolFunc)(const char *name, int val, void *privdata, RedisModuleString **err);
typedef int (*RedisModuleConfigApplyFunc)(RedisModuleCtx *ctx, void *privdata, RedisModuleString **err);

/* X(return type, name without the RedisModule_ prefix, parameter list) */
#define EMQ_RM_REQUIRED(X)                                                                    \
    X(void, SetModuleAttribs, (RedisModuleCtx * ctx, const char *name, int ver, int apiver))  \
    X(int, CreateCommand,                                                                     \
      (RedisModuleCtx * ctx, const char *name, RedisModuleCmdFunc fn, const char *flags,      \
       int firstkey, int lastkey, int keystep))                                               \
    X(void, Log, (RedisModuleCtx * ctx, const char *level, const char *fmt, ...))             \
    X(int, GetContextFlags, (RedisModuleCtx * ctx))                                           \
    X(long long, Milliseconds, (void))                                                        \
    X(void *, Alloc, (size_t bytes))                                                          \
    X(void *, Realloc, (void *ptr, size_t bytes))                                             \
    X(void, Free, (void *ptr))                                                                \
    X(int, WrongArity, (RedisModuleCtx * ctx))                                                \
    X(int, ReplyWithError, (RedisModuleCtx * ctx, const char *err))                           \
    X(int, ReplyWithLongLong, (RedisModuleCtx * ctx, long long ll))                           \
    X(int, ReplyWithArray, (RedisModuleCtx * ctx, long len))                                  \
    X(int, ReplyWithString, (RedisModuleCtx * ctx, RedisModuleString * str))                  \
    X(int, ReplyWithStringBuffer, (RedisModuleCtx * ctx, const char *buf, size_t len))        \
    X(int, ReplyWithSimpleString, (RedisModuleCtx * ctx, const char *msg))                    \
    X(int, ReplyWithNull, (RedisModuleCtx * ctx))                                             \
    X(RedisModuleString *, CreateString, (RedisModuleCtx * ctx, const char *ptr, size_t len)) \
    X(void, FreeString, (RedisModuleCtx * ctx, RedisModuleString * str))                      \
    X(void, RetainString, (RedisModuleCtx * ctx, RedisModuleString * str))                    \
    X(const char *, StringPtrLen, (const RedisModuleString *str, size_t *len))                \
    X(RedisModuleKey *, OpenKey, (RedisModuleCtx * ctx, RedisModuleString * name, int mode))  \
    X(void, CloseKey, (RedisModuleKey * key))                                                 \
    X(int, KeyType, (RedisModuleKey * key))                                                   \
    X(size_t, ValueLength, (RedisModuleKey * key))                                            \
    X(int, ListPush, (RedisModuleKey * key, int where, RedisModuleString *ele))               \
    X(RedisModuleString *, ListPop, (RedisModuleKey * key, int where))                        \
    X(int, ZsetAdd, (RedisModuleKey * key, double score, RedisModuleString *ele, int *flags)) \
    X(int, ZsetRem, (RedisModuleKey * key, RedisModuleString * ele, int *deleted))            \
    X(int, ZsetScore, (RedisModuleKey * key, RedisModuleString * ele, double *score))         \
    X(int, ZsetFirstInScoreRange,                                                             \
      (RedisModuleKey * key, double min, double max, int minex, int maxex))                   \
    X(int, ZsetLastInScoreRange,                                                              \
      (RedisModuleKey * key, double min, double max, int minex, int maxex))                   \
    X(RedisModuleString *, ZsetRangeCurrentElement, (RedisModuleKey * key, double *score))    \
    X(int, ZsetRangeNext, (RedisModuleKey * key))                                             \
    X(int, ZsetRangeEndReached, (RedisModuleKey * key))                                       \
    X(void, ZsetRangeStop, (RedisModuleKey * key))                                            \
    X(int, HashGet, (RedisModuleKey * key, int flags, ...))                                   \
    X(int, HashSet, (RedisModuleKey * key, int flags, ...))                                   \
    X(int, Replicate, (RedisModuleCtx * ctx, const char *cmd, const char *fmt, ...))          \
    X(int, NotifyKeyspaceEvent,                                                               \
      (RedisModuleCtx * ctx, int type, const char *event, RedisModuleString *key))            \
    X(void, SetModuleOptions, (RedisModuleCtx * ctx, int options))                            \
    X(int, SignalModifiedKey, (RedisModuleCtx * ctx, RedisModuleString * keyname))            \
    X(void, GetRandomBytes, (unsigned char *dst, size_t len))                                 \
    X(int, SetAbsExpire, (RedisModuleKey * key, long long expire_ms))                         \
    X(int, SetExpire, (RedisModuleKey * key, long long expire_ms))                            \
    X(long long, GetExpire, (RedisModuleKey * key))                                           \
    X(int, DeleteKey, (RedisModuleKey * key))                                                 \
    X(int, StringSet, (RedisModuleKey * key, RedisModuleString * str))                        \
    X(char *, StringDMA, (RedisModuleKey * key, size_t *len, int mode))                       \
    X(int, PublishMessage,                                                                    \
      (RedisModuleCtx * ctx, RedisModuleString * channel, RedisModuleString * message))       \
    X(RedisModuleCtx *, GetDetachedThreadSafeContext, (RedisModuleCtx * ctx))                 \
    X(void, FreeThreadSafeContext, (RedisModuleCtx * ctx))                                    \
    X(int, GetSelectedDb, (RedisModuleCtx * ctx))                                             \
    X(int, SelectDb, (RedisModuleCtx * ctx, int newid))                                       \
    X(RedisModuleCallReply *, Call, (RedisModuleCtx * ctx, const char *cmd, const char *fmt, ...)) \
    X(void, FreeCallReply, (RedisModuleCallReply * reply))                                   \
    X(size_t, CallReplyLength, (RedisModuleCallReply * reply))                               \
    X(RedisModuleCallReply *, CallReplyArrayElement, (RedisModuleCallReply * reply, size_t idx)) \
    X(RedisModuleString *, CreateStringFromCallReply, (RedisModuleCallReply * reply))        \
    X(RedisModuleBlockedClient *, BlockClientOnKeys,                                          \
      (RedisModuleCtx * ctx, RedisModuleCmdFunc reply_callback, RedisModuleCmdFunc timeout_callback, \
       RedisModuleFreePrivdataFunc free_privdata, long long timeout_ms, RedisModuleString **keys,   \
       int numkeys, void *privdata))                                                          \
    X(void, SignalKeyAsReady, (RedisModuleCtx * ctx, RedisModuleString * key))               \
    X(void *, GetBlockedClientPrivateData, (RedisModuleCtx * ctx))                          \
    X(RedisModuleTimerID, CreateTimer,                                                        \
      (RedisModuleCtx * ctx, long long period, RedisModuleTimerProc callback, void *data))   \
    X(int, StopTimer, (RedisModuleCtx * ctx, RedisModuleTimerID id, void **data))            \
    X(RedisModuleDict *, CreateDict, (RedisModuleCtx * ctx))                                 \
    X(void, FreeDict, (RedisModuleCtx * ctx, RedisModuleDict * d))                           \
    X(uint64_t, DictSize, (RedisModuleDict * d))                                             \
    X(int, DictSetC, (RedisModuleDict * d, void *key, size_t keylen, void *ptr))            \
    X(void *, DictGetC, (RedisModuleDict * d, void *key, size_t keylen, int *nokey))        \
    X(int, DictDelC, (RedisModuleDict * d, void *key, size_t keylen, void *oldval))             \
    X(int, CallReplyType, (RedisModuleCallReply * reply))                                    \
    X(const char *, CallReplyStringPtr, (RedisModuleCallReply * reply, size_t *len))         \
    X(int, SubscribeToKeyspaceEvents, (RedisModuleCtx * ctx, int types, RedisModuleNotificationFunc cb)) \
    X(int, SubscribeToServerEvent,                                                            \
      (RedisModuleCtx * ctx, RedisModuleEvent event, RedisModuleEventCallback callback))      \
    X(RedisModuleScanCursor *, ScanCursorCreate, (void))                                     \
    X(void, ScanCursorDestroy, (RedisModuleScanCursor * cursor))                             \
    X(int, Scan, (RedisModuleCtx * ctx, RedisModuleScanCursor * cursor, RedisModuleScanCB fn, void *privdata))

/* NULL where the server does not have them (each checked at use; what falls
 * back without one is logged at load, emq.c).  Redis 6.2 has
 * IsModuleNameBusy and FreeModuleUser; 7.0 brings the other ACL user
 * functions, GetCommand, SetCommandInfo, the config functions, ListGet and
 * PublishMessageShard; 7.2 SetCommandACLCategories; 7.4 AddACLCategory.
 * Valkey 8 and 9 have all. */
#define EMQ_RM_OPTIONAL(X)                                                                       \
    X(int, IsModuleNameBusy, (const char *name))                                                 \
    X(RedisModuleString *, GetCurrentUserName, (RedisModuleCtx * ctx))                           \
    X(RedisModuleUser *, GetModuleUserFromUserName, (RedisModuleString * name))                  \
    X(void, FreeModuleUser, (RedisModuleUser * user))                                            \
    X(int, ACLCheckCommandPermissions, (RedisModuleUser * user, RedisModuleString **argv, int argc)) \
    X(RedisModuleCommand *, GetCommand, (RedisModuleCtx * ctx, const char *name))                \
    X(int, SetCommandInfo, (RedisModuleCommand * command, const RedisModuleCommandInfo *info))   \
    X(int, SetCommandACLCategories, (RedisModuleCommand * command, const char *categories))      \
    X(int, AddACLCategory, (RedisModuleCtx * ctx, const char *name))                             \
    X(int, RegisterNumericConfig,                                                                \
      (RedisModuleCtx * ctx, const char *name, long long default_val, unsigned int flags,        \
       long long min, long long max, RedisModuleConfigGetNumericFunc getfn,                      \
       RedisModuleConfigSetNumericFunc setfn, RedisModuleConfigApplyFunc applyfn, void *privdata)) \
    X(int, RegisterBoolConfig,                                                                   \
      (RedisModuleCtx * ctx, const char *name, int default_val, unsigned int flags,               \
       RedisModuleConfigGetBoolFunc getfn, RedisModuleConfigSetBoolFunc setfn,                     \
       RedisModuleConfigApplyFunc applyfn, void *privdata))                                        \
    X(int, LoadConfigs, (RedisModuleCtx * ctx))                                                   \
    X(RedisModuleString *, ListGet, (RedisModuleKey * key, long index))                          \
    X(int, PublishMessageShard,                                                                  \
      (RedisModuleCtx * ctx, RedisModuleString * channel, RedisModuleString * message))

#define EMQ_RM_DECLARE(ret, name, params) extern ret(*RedisModule_##name) params;
EMQ_RM_REQUIRED(EMQ_RM_DECLARE)
EMQ_RM_OPTIONAL(EMQ_RM_DECLARE)
#undef EMQ_RM_DECLARE

/* Fill every pointer and register the module under `name`.  Fails (and the
 * server refuses to load us) when a required function is missing or the name
 * is taken. */
int emq_rm_init(RedisModuleCtx *ctx, const char *name, int version);

/* The optional functions the running server lacks (names without the
 * RedisModule_ prefix), NULL-terminated; filled by emq_rm_init so that
 * OnLoad can say in the server log what falls back and why. */
const char *const *emq_rm_missing_optional(void);

#endif
