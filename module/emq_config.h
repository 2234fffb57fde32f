/* emq_config.h -- the operator's ceilings: server-side settings no client
 * can raise.
 *
 *   emq.max-limit        (default 10000)  the most jobs one command may
 *                        take in one call: SWEEP's <limit> today, and every
 *                        batch size a verb takes (a count, a bulk retry or
 *                        purge); a larger one is refused with
 *                        EMQ_ERR_LIMIT_TOO_LARGE, which names the setting.
 *   emq.max-state-bytes  (default 65536)  the largest checkpoint state blob
 *                        (or progress) a job may store.
 *   emq.max-payload-bytes (default 1 MiB)  the largest payload ENQUEUE and
 *                        ENQUEUEMANY take.
 *   emq.max-result-bytes (default 1 MiB)  the largest result COMPLETE and
 *                        COMPLETECLAIM store.
 *   emq.schedule-timer   (default yes)  whether the server fires due
 *                        schedule ticks itself (emq_schedules.h); no: no
 *                        timer, no index.
 *
 * Where the server has module configs (Redis 7.0+, Valkey), they are
 * `CONFIG GET/SET emq.<name>`, `emq.<name> <value>` in the config file, and
 * `MODULE LOADEX ... CONFIG emq.<name> <value>`.  On every server they may
 * also be given as load arguments, `--loadmodule emq.so max-limit 500`; that
 * is the value at load (where configs exist, the config file and LOADEX
 * take precedence over it), and on Redis 6.2 the only way. */
#ifndef EMQ_CONFIG_H
#define EMQ_CONFIG_H

#include "emq_rm.h"

/* The current values; the verbs read them on every call. */
long long emq_config_max_limit(void);
long long emq_config_max_state_bytes(void);
long long emq_config_max_payload_bytes(void);
long long emq_config_max_result_bytes(void);
int emq_config_schedule_timer(void);

/* Read the load arguments, NAME VALUE pairs.  An unknown name, a missing
 * or bad value, or a repeated name is refused: logged, and ERR returned. */
int emq_config_load_args(RedisModuleCtx *ctx, RedisModuleString **argv, int argc);

/* Register the settings as module configs and apply the config file's
 * values, where the server has module configs; ERR (logged) when the
 * server refuses one. */
int emq_config_register(RedisModuleCtx *ctx);

/* 1 when the settings are module configs on this server (CONFIG SET works). */
int emq_config_is_live(void);

#endif
