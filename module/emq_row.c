/* emq_row.c -- see emq_row.h. */
#include "emq_row.h"

#include <string.h>

#include "emq.h"

RedisModuleString *emq_piece_name[EMQ_VALUES][16];

int emq_row_pieces(EmqFx *fx, int which, RedisModuleString *value, RedisModuleString **fields,
                   RedisModuleString **values) {
    size_t len;
    const char *p = RedisModule_StringPtrLen(value, &len);
    int n = emq_pieces(len);
    fields[0] = emq_piece_name[which][0];
    if (n == 1) {
        values[0] = value;
        return 1;
    }
    for (int i = 0; i < n; i++) {
        size_t at = (size_t)i * EMQ_PIECE_BYTES, take = len - at < EMQ_PIECE_BYTES ? len - at : EMQ_PIECE_BYTES;
        fields[i] = emq_piece_name[which][i];
        values[i] = emq_fx_own(fx, RedisModule_CreateString(NULL, p + at, take));
    }
    return n;
}

/* Only a value of exactly EMQ_PIECE_BYTES in its own field can have pieces
 * after it: a pieced value's head is a full piece, a whole one is shorter
 * or longer than that. */
static int may_have_pieces(EmqKey *row, int which) {
    RedisModuleString *head = emq_hget(row, emq_piece_name[which][0]);
    if (head == NULL) return 0;
    size_t len;
    RedisModule_StringPtrLen(head, &len);
    RedisModule_FreeString(NULL, head);
    return len == EMQ_PIECE_BYTES;
}

void emq_row_drop_pieces(EmqFx *fx, EmqKey *row, int which, int keep) {
    if (!may_have_pieces(row, which)) return;
    for (int i = keep < 1 ? 1 : keep; i < EMQ_MAX_PIECES; i++)
        if (!emq_fx_hdel(fx, row, emq_piece_name[which][i])) break;
}

RedisModuleString *emq_row_value(EmqKey *row, int which) {
    RedisModuleString *head = emq_hget(row, emq_piece_name[which][0]);
    if (head == NULL) return NULL;
    size_t len;
    const char *p = RedisModule_StringPtrLen(head, &len);
    if (len != EMQ_PIECE_BYTES) return head;
    char buf[EMQ_PIECED_MAX];
    memcpy(buf, p, len);
    size_t total = len;
    for (int i = 1; i < EMQ_MAX_PIECES; i++) {
        RedisModuleString *piece = emq_hget(row, emq_piece_name[which][i]);
        if (piece == NULL) break;
        size_t plen;
        const char *pp = RedisModule_StringPtrLen(piece, &plen);
        /* A piece longer than a piece, or one more than a value has: not
         * ours (a hand-written field); the head alone is the value then. */
        if (plen > EMQ_PIECE_BYTES || total + plen > sizeof buf) {
            RedisModule_FreeString(NULL, piece);
            break;
        }
        memcpy(buf + total, pp, plen);
        total += plen;
        RedisModule_FreeString(NULL, piece);
    }
    if (total == len) return head;
    RedisModule_FreeString(NULL, head);
    return RedisModule_CreateString(NULL, buf, total);
}

int emq_row_level(EmqKey *row, long long *level) {
    RedisModuleString *v = emq_hget(row, emq_str.priority);
    size_t len = 0;
    const char *p = v ? RedisModule_StringPtrLen(v, &len) : NULL;
    int err = emq_row_priority(p, len, v != NULL, level);
    if (v) RedisModule_FreeString(NULL, v);
    return err;
}
