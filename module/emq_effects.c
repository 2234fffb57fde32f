/* emq_effects.c -- see emq_effects.h. */
#include "emq_effects.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "emq.h"

/* One command to propagate: argv[0] is the key, the rest its arguments;
 * `xx` marks a ZADD XX (it cannot join a plain ZADD). */
struct EmqFxEntry {
    const char *cmd;
    int xx;
    RedisModuleString **argv;
    int argc, cap;
};

void emq_fx_begin(EmqFx *fx, RedisModuleCtx *ctx) {
    memset(fx, 0, sizeof *fx);
    fx->ctx = ctx;
}

static void push_arg(EmqFxEntry *e, RedisModuleString *s) {
    if (e->argc == e->cap) {
        e->cap = e->cap ? e->cap * 2 : 8;
        e->argv = RedisModule_Realloc(e->argv, (size_t)e->cap * sizeof *e->argv);
    }
    RedisModule_RetainString(NULL, s);
    e->argv[e->argc++] = s;
}

/* The entry this write joins: the key's latest one when it is the same
 * kind of command, else a new one at the end.  Joining an earlier entry
 * reorders this write only against writes to other keys, which commute. */
/* A handle opened on an absent key holds no value; if another handle of the
 * same command has created the key since (two steps of one verb may each
 * open <base>meta, say), writing through the first would make the server
 * add the key a second time (an assertion: the server goes down).  So every
 * write through a handle that holds no value opens the key again first: at
 * the cost of one lookup, and only for a key absent when it was opened. */
static void fresh(EmqKey *k) {
    if (k->key == NULL || RedisModule_KeyType(k->key) != REDISMODULE_KEYTYPE_EMPTY) return;
    RedisModule_CloseKey(k->key);
    k->key = RedisModule_OpenKey(k->ctx, k->name, REDISMODULE_READ | REDISMODULE_WRITE);
}

static EmqFxEntry *entry_for(EmqFx *fx, EmqKey *k, const char *cmd, int xx) {
    if (k->last >= 0 && k->last < fx->n) {
        EmqFxEntry *e = &fx->entries[k->last];
        if (e->cmd == cmd && e->xx == xx && e->argv[0] == k->name) return e;
    }
    if (fx->n == fx->cap) {
        fx->cap = fx->cap ? fx->cap * 2 : 8;
        fx->entries = RedisModule_Realloc(fx->entries, (size_t)fx->cap * sizeof *fx->entries);
    }
    EmqFxEntry *e = &fx->entries[fx->n];
    memset(e, 0, sizeof *e);
    e->cmd = cmd;
    e->xx = xx;
    push_arg(e, k->name);
    k->last = fx->n++;
    return e;
}

RedisModuleString *emq_fx_own(EmqFx *fx, RedisModuleString *s) {
    if (fx->nowned == fx->capowned) {
        fx->capowned = fx->capowned ? fx->capowned * 2 : 8;
        fx->owned = RedisModule_Realloc(fx->owned, (size_t)fx->capowned * sizeof *fx->owned);
    }
    fx->owned[fx->nowned++] = s;
    return s;
}

RedisModuleString *emq_fx_number(EmqFx *fx, long long v) {
    if (v >= 0 && v < EMQ_SMALL_INTS) return emq_small_int[v];
    char buf[24];
    int n = emq_format_ll(v, buf);
    return emq_fx_own(fx, RedisModule_CreateString(NULL, buf, (size_t)n));
}

static const char ZADD[] = "ZADD", ZREM[] = "ZREM", HSET[] = "HSET", HDEL[] = "HDEL", SET[] = "SET",
                  PEXPIREAT[] = "PEXPIREAT", PERSIST[] = "PERSIST", DEL[] = "DEL", RPUSH[] = "RPUSH",
                  LPUSH[] = "LPUSH", LPOP[] = "LPOP";

int emq_fx_zadd(EmqFx *fx, EmqKey *set, long long score, RedisModuleString *member, int xx) {
    fresh(set);
    int flags = xx ? REDISMODULE_ZADD_XX : 0;
    /* An absent set is not handed to ZsetAdd under XX: it would create the
     * key before finding nothing to update. */
    if (xx && RedisModule_KeyType(set->key) == REDISMODULE_KEYTYPE_EMPTY) return REDISMODULE_ZADD_NOP;
    if (RedisModule_ZsetAdd(set->key, (double)score, member, &flags) != REDISMODULE_OK)
        return REDISMODULE_ZADD_NOP;
    if (!(flags & (REDISMODULE_ZADD_ADDED | REDISMODULE_ZADD_UPDATED))) return flags;
    set->modified = 1;
    RedisModule_NotifyKeyspaceEvent(fx->ctx, REDISMODULE_NOTIFY_ZSET, "zadd", set->name);
    EmqFxEntry *e = entry_for(fx, set, ZADD, xx);
    if (xx && e->argc == 1) push_arg(e, emq_str.xx);
    push_arg(e, emq_fx_number(fx, score));
    push_arg(e, member);
    return flags;
}

long emq_fx_zadd_many(EmqFx *fx, EmqKey *set, long long score, RedisModuleString *const *members, long n) {
    fresh(set);
    long changed = 0;
    EmqFxEntry *e = NULL;
    RedisModuleString *at = NULL;
    for (long i = 0; i < n; i++) {
        int flags = 0;
        if (RedisModule_ZsetAdd(set->key, (double)score, members[i], &flags) != REDISMODULE_OK) continue;
        if (!(flags & (REDISMODULE_ZADD_ADDED | REDISMODULE_ZADD_UPDATED))) continue;
        if (e == NULL) {
            e = entry_for(fx, set, ZADD, 0);
            at = emq_fx_number(fx, score);
        }
        push_arg(e, at);
        push_arg(e, members[i]);
        changed++;
    }
    if (changed) {
        set->modified = 1;
        RedisModule_NotifyKeyspaceEvent(fx->ctx, REDISMODULE_NOTIFY_ZSET, "zadd", set->name);
    }
    return changed;
}

long emq_fx_zadd_pairs(EmqFx *fx, EmqKey *set, const long long *scores, RedisModuleString *const *members, long n) {
    long changed = 0;
    EmqFxEntry *e = NULL;
    for (long i = 0; i < n; i++) {
        int flags = 0;
        if (RedisModule_ZsetAdd(set->key, (double)scores[i], members[i], &flags) != REDISMODULE_OK) continue;
        if (!(flags & (REDISMODULE_ZADD_ADDED | REDISMODULE_ZADD_UPDATED))) continue;
        if (e == NULL) e = entry_for(fx, set, ZADD, 0);
        push_arg(e, emq_fx_number(fx, scores[i]));
        push_arg(e, members[i]);
        changed++;
    }
    if (changed) {
        set->modified = 1;
        RedisModule_NotifyKeyspaceEvent(fx->ctx, REDISMODULE_NOTIFY_ZSET, "zadd", set->name);
    }
    return changed;
}

long emq_fx_zrem_many(EmqFx *fx, EmqKey *set, RedisModuleString *const *members, long n) {
    long removed = 0;
    EmqFxEntry *e = NULL;
    for (long i = 0; i < n; i++) {
        int deleted = 0;
        if (RedisModule_KeyType(set->key) != REDISMODULE_KEYTYPE_ZSET) break;
        RedisModule_ZsetRem(set->key, members[i], &deleted);
        if (!deleted) continue;
        if (e == NULL) e = entry_for(fx, set, ZREM, 0);
        push_arg(e, members[i]);
        removed++;
    }
    if (removed == 0) return 0;
    set->modified = 1;
    RedisModule_NotifyKeyspaceEvent(fx->ctx, REDISMODULE_NOTIFY_ZSET, "zrem", set->name);
    if (RedisModule_KeyType(set->key) == REDISMODULE_KEYTYPE_EMPTY)
        RedisModule_NotifyKeyspaceEvent(fx->ctx, REDISMODULE_NOTIFY_GENERIC, "del", set->name);
    return removed;
}

void emq_fx_push(EmqFx *fx, EmqKey *list, int head, RedisModuleString *const *members, long n) {
    fresh(list);
    if (n <= 0) return;
    EmqFxEntry *e = entry_for(fx, list, head ? LPUSH : RPUSH, 0);
    for (long i = 0; i < n; i++) {
        RedisModule_ListPush(list->key, head ? REDISMODULE_LIST_HEAD : REDISMODULE_LIST_TAIL, members[i]);
        push_arg(e, members[i]);
    }
    list->modified = 1;
    RedisModule_NotifyKeyspaceEvent(fx->ctx, REDISMODULE_NOTIFY_LIST, head ? "lpush" : "rpush", list->name);
}

long emq_fx_lpop(EmqFx *fx, EmqKey *list, long n) {
    long popped = 0;
    while (popped < n && RedisModule_KeyType(list->key) == REDISMODULE_KEYTYPE_LIST) {
        RedisModuleString *s = RedisModule_ListPop(list->key, REDISMODULE_LIST_HEAD);
        if (s == NULL) break;
        RedisModule_FreeString(NULL, s);
        popped++;
    }
    if (popped == 0) return 0;
    list->modified = 1;
    RedisModule_NotifyKeyspaceEvent(fx->ctx, REDISMODULE_NOTIFY_LIST, "lpop", list->name);
    /* The API deletes a list it emptied, silently; LPOP says "del". */
    if (RedisModule_KeyType(list->key) == REDISMODULE_KEYTYPE_EMPTY)
        RedisModule_NotifyKeyspaceEvent(fx->ctx, REDISMODULE_NOTIFY_GENERIC, "del", list->name);
    /* A count, not the entries: a replica pops the same head (its list is the master's). */
    EmqFxEntry *e = entry_for(fx, list, LPOP, 0);
    if (e->argc == 2) { /* a second LPOP of the key in one command: one LPOP of both counts */
        size_t len;
        const char *p = RedisModule_StringPtrLen(e->argv[1], &len);
        long long before = 0;
        emq_parse_ll(p, len, &before);
        RedisModule_FreeString(NULL, e->argv[1]);
        e->argc = 1;
        popped += (long)before;
    }
    push_arg(e, emq_fx_number(fx, popped));
    return popped;
}

int emq_fx_zrem(EmqFx *fx, EmqKey *set, RedisModuleString *member) {
    fresh(set);
    int deleted = 0;
    RedisModule_ZsetRem(set->key, member, &deleted);
    if (!deleted) return 0;
    set->modified = 1;
    RedisModule_NotifyKeyspaceEvent(fx->ctx, REDISMODULE_NOTIFY_ZSET, "zrem", set->name);
    /* The API deletes a set it emptied, silently; ZREM says "del". */
    if (RedisModule_KeyType(set->key) == REDISMODULE_KEYTYPE_EMPTY)
        RedisModule_NotifyKeyspaceEvent(fx->ctx, REDISMODULE_NOTIFY_GENERIC, "del", set->name);
    push_arg(entry_for(fx, set, ZREM, 0), member);
    return 1;
}

static int same_bytes(RedisModuleString *a, RedisModuleString *b) {
    if (a == b) return 1;
    size_t alen, blen;
    const char *ap = RedisModule_StringPtrLen(a, &alen), *bp = RedisModule_StringPtrLen(b, &blen);
    return alen == blen && memcmp(ap, bp, alen) == 0;
}

void emq_fx_hset(EmqFx *fx, EmqKey *row, const char *event, int npairs, ...) {
    fresh(row);
    EmqFxEntry *e = entry_for(fx, row, HSET, 0);
    va_list ap;
    va_start(ap, npairs);
    for (int p = 0; p < npairs; p++) {
        RedisModuleString *field = va_arg(ap, RedisModuleString *);
        RedisModuleString *value = va_arg(ap, RedisModuleString *);
        RedisModule_HashSet(row->key, REDISMODULE_HASH_NONE, field, value, NULL);
        /* A field set twice in one command propagates once, with its last value. */
        int i = 1;
        while (i < e->argc && !same_bytes(e->argv[i], field)) i += 2;
        if (i < e->argc) {
            RedisModule_RetainString(NULL, value);
            RedisModule_FreeString(NULL, e->argv[i + 1]);
            e->argv[i + 1] = value;
        } else {
            push_arg(e, field);
            push_arg(e, value);
        }
    }
    va_end(ap);
    row->modified = 1;
    RedisModule_NotifyKeyspaceEvent(fx->ctx, REDISMODULE_NOTIFY_HASH, event, row->name);
}

void emq_fx_hset_argv(EmqFx *fx, EmqKey *row, const char *event, int npairs, RedisModuleString *const *fields,
                      RedisModuleString *const *values) {
    fresh(row);
    EmqFxEntry *e = entry_for(fx, row, HSET, 0);
    for (int p = 0; p < npairs; p++) {
        RedisModule_HashSet(row->key, REDISMODULE_HASH_NONE, fields[p], values[p], NULL);
        int i = 1;
        while (i < e->argc && !same_bytes(e->argv[i], fields[p])) i += 2;
        if (i < e->argc) {
            RedisModule_RetainString(NULL, values[p]);
            RedisModule_FreeString(NULL, e->argv[i + 1]);
            e->argv[i + 1] = values[p];
        } else {
            push_arg(e, fields[p]);
            push_arg(e, values[p]);
        }
    }
    row->modified = 1;
    RedisModule_NotifyKeyspaceEvent(fx->ctx, REDISMODULE_NOTIFY_HASH, event, row->name);
}

int emq_fx_hdel(EmqFx *fx, EmqKey *row, RedisModuleString *field) {
    fresh(row);
    if (RedisModule_KeyType(row->key) != REDISMODULE_KEYTYPE_HASH) return 0;
    if (!RedisModule_HashSet(row->key, REDISMODULE_HASH_NONE, field, REDISMODULE_HASH_DELETE, NULL)) return 0;
    row->modified = 1;
    RedisModule_NotifyKeyspaceEvent(fx->ctx, REDISMODULE_NOTIFY_HASH, "hdel", row->name);
    /* The API deletes a hash it emptied, as HDEL does; HDEL then says "del". */
    if (RedisModule_KeyType(row->key) == REDISMODULE_KEYTYPE_EMPTY)
        RedisModule_NotifyKeyspaceEvent(fx->ctx, REDISMODULE_NOTIFY_GENERIC, "del", row->name);
    push_arg(entry_for(fx, row, HDEL, 0), field);
    return 1;
}

void emq_fx_set(EmqFx *fx, EmqKey *key, RedisModuleString *value) {
    fresh(key);
    RedisModule_StringSet(key->key, value);
    key->modified = 1;
    RedisModule_NotifyKeyspaceEvent(fx->ctx, REDISMODULE_NOTIFY_STRING, "set", key->name);
    EmqFxEntry *e = entry_for(fx, key, SET, 0);
    /* a second SET of the key in one command: the last value wins, without the
     * first one's PXAT (a SET clears the key's expiry, RM_StringSet's too) */
    while (e->argc > 1) RedisModule_FreeString(NULL, e->argv[--e->argc]);
    push_arg(e, value);
}

void emq_fx_pexpireat(EmqFx *fx, EmqKey *key, long long at_ms) {
    if (RedisModule_SetAbsExpire(key->key, at_ms) != REDISMODULE_OK) return;
    key->modified = 1;
    RedisModule_NotifyKeyspaceEvent(fx->ctx, REDISMODULE_NOTIFY_GENERIC, "expire", key->name);
    if (key->last >= 0 && key->last < fx->n) {
        /* Right after the key's SET: one SET <key> <value> PXAT <ms> (Redis 6.2+, as
         * every engine we serve), one command fewer to replicate than SET then
         * PEXPIREAT, with the same effect and the same events on a replica. */
        EmqFxEntry *set = &fx->entries[key->last];
        if (set->cmd == SET && set->argv[0] == key->name && set->argc >= 2) {
            while (set->argc > 2) RedisModule_FreeString(NULL, set->argv[--set->argc]);
            push_arg(set, emq_str.pxat);
            push_arg(set, emq_fx_number(fx, at_ms));
            return;
        }
    }
    EmqFxEntry *e = entry_for(fx, key, PEXPIREAT, 0);
    if (e->argc == 2) {
        RedisModule_FreeString(NULL, e->argv[1]);
        e->argc = 1;
    }
    push_arg(e, emq_fx_number(fx, at_ms));
}

void emq_fx_persist(EmqFx *fx, EmqKey *key) {
    if (RedisModule_KeyType(key->key) == REDISMODULE_KEYTYPE_EMPTY) return;
    if (RedisModule_GetExpire(key->key) == REDISMODULE_NO_EXPIRE) return;
    RedisModule_SetExpire(key->key, REDISMODULE_NO_EXPIRE);
    key->modified = 1;
    RedisModule_NotifyKeyspaceEvent(fx->ctx, REDISMODULE_NOTIFY_GENERIC, "persist", key->name);
    entry_for(fx, key, PERSIST, 0);
}

void emq_fx_del(EmqFx *fx, EmqKey *key) {
    if (RedisModule_KeyType(key->key) == REDISMODULE_KEYTYPE_EMPTY) return;
    RedisModule_DeleteKey(key->key);
    key->modified = 1;
    RedisModule_NotifyKeyspaceEvent(fx->ctx, REDISMODULE_NOTIFY_GENERIC, "del", key->name);
    entry_for(fx, key, DEL, 0);
}

void emq_fx_retain(EmqFx *fx, EmqKey *row, long long now_ms, long long ttl_ms) {
    long long at = 0;
    switch (emq_retain(now_ms, ttl_ms, &at)) {
    case EMQ_RETAIN_EXPIRE:
        emq_fx_pexpireat(fx, row, at);
        break;
    case EMQ_RETAIN_DELETE:
        emq_fx_del(fx, row);
        break;
    default:
        break;
    }
}

void emq_fx_commit(EmqFx *fx) {
    for (int i = 0; i < fx->n; i++) {
        EmqFxEntry *e = &fx->entries[i];
        RedisModule_Replicate(fx->ctx, e->cmd, "v", e->argv, (size_t)e->argc);
        for (int a = 0; a < e->argc; a++) RedisModule_FreeString(NULL, e->argv[a]);
        RedisModule_Free(e->argv);
    }
    RedisModule_Free(fx->entries);
    for (int i = 0; i < fx->nowned; i++) RedisModule_FreeString(NULL, fx->owned[i]);
    RedisModule_Free(fx->owned);
    memset(fx, 0, sizeof *fx);
}
