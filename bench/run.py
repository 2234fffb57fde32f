"""The EchoMQ benchmark: native EMQ.* against the seed's Lua and the physical floor.

    make bench                      # or: .venv/bin/python bench/run.py [--quick]
                                    #     [--engine NAME | --server-bin PATH]

One run starts one redis-server of its own (echomq.testing.EmbeddedServer, emq.so
loaded), and measures, in interleaved rounds so every contender shares the
machine's drift:

1. EXTEND: redis-benchmark, pipeline 16, over 100,000 live jobs: EMQ.EXTEND
   vs the seed's Lua (EVALSHA) vs a bare ZADD on the same active set.
   Throughput, and the server's own CPU per call (INFO commandstats
   usec_per_call after CONFIG RESETSTAT).
2. SWEEP: 100,000 lapsed jobs in one call, and `limit 100` calls against
   1,000,000 active members: server microseconds per swept job, native vs
   the seed's Lua vs the floor (the same writes issued as bare core commands,
   their server time summed from commandstats).  Per-call server latency
   (SLOWLOG at 0 us) for the limit calls, at 1,000,000 and 10,000 members.
3. Python: client.extend() against a raw execute_command("EMQ.EXTEND", ...),
   and extend_many() (one round trip) against one extend() per job.
4. Claim path (bench/claim_path.py, servers of its own): idle commands per
   second of 8 waiting claim loops (polling vs claim(block_ms=...)),
   enqueue-to-claim latency, delayed-job lateness, batch enqueue rate; then
   idle Workers (bench/idle_workers.py): the commands an idle Worker of 1, 8
   and 64 slots sends at its defaults, and its stop's latency.
   `--only claimpath` runs only it.
5. Backends (bench/backends.py, a server of its own): every verb through EMQ.* and
   through its script (the scripts backend, for servers without the module): server
   usec per call (the EVALSHA line of commandstats) and calls per second; a waiting
   claim's idle commands and enqueue-to-claim latency, module BLOCK against the
   scripts' polling.  `--only backends` runs only it.
6. Memory (bench/memory.py, servers of their own, Redis 7.0 and Valkey 8): bytes per
   waiting and per done job before (main's module) and after, the cost of each part of
   a row, CLAIM's server usec per claim with no priority, one level and 100 levels.
   `--only memory` runs only it.
6b. Unique jobs (bench/unique.py, servers of their own, Redis 7.0 and Valkey 8): ENQUEUE's
   server usec with UNIQUE (a new key, a held key, FOR) against without, and the bytes a
   unique key adds per job.  `--only unique` runs only it.
7. Many workers, one server (bench/saturation.py, servers of their own): 1, 2, 4
   and 8 worker processes of echomq's sync and asyncio Workers and of BullMQ
   drain one queue; jobs/s, the server's CPU per job and its utilisation, where
   each saturates.  `--only saturation` runs only it.
7b. Instructions per call (bench/instructions.py, a server of its own under callgrind):
   each verb's exact count of the server's instructions, EXTEND's against a bare ZADD's,
   and every figure's ratio to bench/instructions-baseline.json: the one figure a
   drifting VM cannot move.  `--only instructions` runs only it.
7d. The worker's own cost per job (bench/worker_cost.py, a server of its own): Python calls
   and C calls per no-op job of each worker shape (sync 1 and 10 threads, asyncio 10 tasks,
   `@app.task` sync and asyncio), counted by a profile hook, against
   bench/worker-cost-baseline.json.  `--only workercost` runs only it.
7c. Schedule ticks (bench/ticks.py, servers of their own): how late a schedule's jobs are
   enqueued after their ticks (p50, p99, worst) and how many are missed, by driver (thread and
   asyncio workers at their defaults), module and scripts.  `--only ticks` runs only it.
8. Peers (bench/peers/harness.py, after the server above has stopped): the
   same N no-op jobs through echomq's workers, RQ, arq, saq and BullMQ, each
   on a fresh server of its own; then remote-cancel latency and enqueue rate.
   `--no-peers` skips it; `--only peers` runs only it.

Verdicts are ratios from this one run, never an absolute time.  Results go
to bench/results/ (JSON and markdown, also printed).
"""

from __future__ import annotations

import argparse
import datetime
import json
import platform
import random
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # the seed's scripts live with the tests

import redis  # noqa: E402

import echomq  # noqa: E402
from bench import (  # noqa: E402
    backends,
    claim_path,
    flow,
    idle_workers,
    instructions,
    memory,
    saturation,
    ticks,
    unique,
    worker_cost,
)
from bench.peers import harness as peers  # noqa: E402
from echomq.keyspace import QueueKeys, queue_keys  # noqa: E402
from echomq.testing import EmbeddedServer  # noqa: E402
from tests.seed_scripts import EXTEND_LUA_ORIGINAL, SWEEP_LUA  # noqa: E402

RESULTS = ROOT / "bench" / "results"


@dataclass(frozen=True)
class Sizes:
    rounds: int
    extend_jobs: int
    extend_requests: int
    sweep_bulk: int
    limit_members: int
    limit_small_members: int
    limit_calls: int
    py_calls: int
    py_batch: int


FULL = Sizes(
    rounds=5,
    extend_jobs=100_000,
    extend_requests=300_000,
    sweep_bulk=100_000,
    limit_members=1_000_000,
    limit_small_members=10_000,
    limit_calls=200,
    py_calls=3_000,
    py_batch=100,
)
QUICK = Sizes(
    rounds=2,
    extend_jobs=10_000,
    extend_requests=30_000,
    sweep_bulk=5_000,
    limit_members=50_000,
    limit_small_members=5_000,
    limit_calls=20,
    py_calls=300,
    py_batch=50,
)

LIMIT = 100
MAX_STALLED = 3
LEASE_MS = 60_000

# Server-side population: one script per data set, so a reset between
# contenders costs milliseconds, not a million round trips.  Ids are
# redis-benchmark's __rand_int__ format (12 digits, zero-padded).
# Live leases end at distinct milliseconds spread over the next minute, as
# real ones do (equal scores would make every skiplist step a string compare).
POPULATE_LIVE = """
local n, base, deadline = tonumber(ARGV[1]), ARGV[2], tonumber(ARGV[3])
for i = 0, n - 1 do
  local id = string.format('%012d', i)
  redis.call('HSET', base .. 'job:' .. id, 'attempts', '1', 'token', '1', 'state', 'active')
  redis.call('ZADD', KEYS[1], deadline + (i * 7919) % n, id)
end
"""

# Members that only hold the set's size: live leases without rows, never
# touched by a sweep.
POPULATE_MEMBERS = """
local n, deadline, chunk = tonumber(ARGV[1]), tonumber(ARGV[2]), {}
for i = 0, n - 1 do
  chunk[#chunk + 1] = deadline + i
  chunk[#chunk + 1] = string.format('live%012d', i)
  if #chunk == 2000 or i == n - 1 then
    redis.call('ZADD', KEYS[1], unpack(chunk))
    chunk = {}
  end
end
"""

# Lapsed jobs: id i has stalled = i % 3, so with max-stalled 3 one in three
# dies and two recover.  The rows are recreated from scratch.
POPULATE_LAPSED = """
local n, base = tonumber(ARGV[1]), ARGV[2]
redis.call('DEL', KEYS[2], KEYS[3], base .. 'metrics:failed')
for i = 0, n - 1 do
  local id = string.format('%012d', i)
  local row = base .. 'job:' .. id
  redis.call('DEL', row)
  redis.call('HSET', row, 'attempts', '1', 'token', '1', 'state', 'active', 'stalled', tostring(i % 3))
  redis.call('ZADD', KEYS[1], i + 1, id)
end
"""


def server_ms(r: redis.Redis) -> int:
    seconds, micros = r.time()
    return int(seconds) * 1000 + int(micros) // 1000


def lapsed_dies(i: int) -> bool:
    return i % 3 + 1 >= MAX_STALLED


# --------------------------------------------------------------------------
# Server statistics


def commandstats(r: redis.Redis) -> dict[str, dict[str, float]]:
    info: dict[str, Any] = r.info("commandstats")
    return {name.removeprefix("cmdstat_"): stats for name, stats in info.items()}


def server_usec(r: redis.Redis, commands: list[str]) -> tuple[int, float]:
    """(calls, usec) summed over `commands` since the last CONFIG RESETSTAT."""
    stats = commandstats(r)
    calls = sum(int(stats.get(c, {}).get("calls", 0)) for c in commands)
    usec = sum(float(stats.get(c, {}).get("usec", 0)) for c in commands)
    return calls, usec


def reset_stats(r: redis.Redis) -> None:
    r.config_resetstat()
    r.slowlog_reset()


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    if not ordered:
        return float("nan")
    k = min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))
    return ordered[k]


def median(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


def rotate(items: list[Any], k: int) -> list[Any]:
    k %= len(items)
    return items[k:] + items[:k]


# --------------------------------------------------------------------------
# 1. EXTEND under redis-benchmark


def redis_benchmark(port: int, requests: int, keyspace: int, command: list[str]) -> float:
    """Requests per second as redis-benchmark reports it."""
    out = subprocess.run(
        [
            "redis-benchmark",
            "-h",
            "127.0.0.1",
            "-p",
            str(port),
            "-n",
            str(requests),
            "-P",
            "16",
            "-c",
            "50",
            "-r",
            str(keyspace),
            "-q",
            "--csv",
            *command,
        ],
        check=True,
        capture_output=True,
        text=True,
        timeout=600,
    ).stdout
    row = out.strip().splitlines()[-1]
    return float(row.split('","')[1])


def bench_extend(server: EmbeddedServer, r: redis.Redis, sizes: Sizes) -> dict[str, Any]:
    keys = queue_keys("bench")
    r.flushall()
    r.eval(POPULATE_LIVE, 1, keys.active, sizes.extend_jobs, keys.base, server_ms(r) + LEASE_MS)
    sha = r.script_load(EXTEND_LUA_ORIGINAL)
    # __rand_1st__ is one draw per command: the row and the member are one random
    # live job (v2 refuses a <job> that is not <id>'s row; each __rand_int__ is a
    # draw of its own).
    row, member = keys.base + "job:__rand_1st__", "__rand_1st__"
    contenders: dict[str, tuple[list[str], list[str]]] = {
        "native": (["EMQ.EXTEND", keys.active, row, member, "1", str(LEASE_MS)], ["emq.extend"]),
        "lua": (["EVALSHA", sha, "2", keys.active, row, member, "1", str(LEASE_MS)], ["evalsha"]),
        # The floor re-scores a random member to a random position: the same
        # skiplist delete + insert a lease extension does.
        "zadd": (["ZADD", keys.active, "XX", "__rand_int__", member], ["zadd"]),
    }
    samples: dict[str, list[tuple[float, float]]] = {name: [] for name in contenders}
    for rnd in range(sizes.rounds):
        for name in rotate(list(contenders), rnd):
            command, stat = contenders[name]
            reset_stats(r)
            rps = redis_benchmark(server.port, sizes.extend_requests, sizes.extend_jobs, command)
            calls, usec = server_usec(r, stat)
            if calls < sizes.extend_requests:
                raise RuntimeError(f"extend/{name}: {calls} calls counted, expected {sizes.extend_requests}")
            samples[name].append((rps, usec / calls))
    # Every extension answered :1 (the ids are live, the token matches).
    errors = {k: v["failed_calls"] for k, v in commandstats(r).items() if v.get("failed_calls")}
    if errors:
        raise RuntimeError(f"extend: failed calls {errors}")
    return {
        name: {
            "rps": [s[0] for s in rows],
            "usec_per_call": [s[1] for s in rows],
        }
        for name, rows in samples.items()
    } | {
        "throughput_vs_zadd": [n[0] / z[0] for n, z in zip(samples["native"], samples["zadd"], strict=True)],
        "lua_cpu_over_native": [
            lu[1] / n[1] for n, lu in zip(samples["native"], samples["lua"], strict=True)
        ],
    }


# --------------------------------------------------------------------------
# 2. SWEEP


class SweepSet:
    """A queue with `lapsed` expired jobs among `members` live ones."""

    def __init__(self, r: redis.Redis, queue: str, lapsed: int, members: int) -> None:
        self.r, self.keys, self.lapsed = r, queue_keys(queue), lapsed
        self.sweep_sha = r.script_load(SWEEP_LUA)
        self.populate_sha = r.script_load(POPULATE_LAPSED)
        if members:
            r.eval(POPULATE_MEMBERS, 1, self.keys.active, members, server_ms(r) + 3_600_000)

    def reset(self) -> None:
        k = self.keys
        self.r.evalsha(self.populate_sha, 3, k.active, k.pending, k.dead, self.lapsed, k.base)

    def native(self, limit: int) -> Any:
        k = self.keys
        return self.r.execute_command("EMQ.SWEEP", k.active, k.pending, k.dead, k.base, MAX_STALLED, limit)

    def lua(self, limit: int) -> Any:
        k = self.keys
        return self.r.evalsha(self.sweep_sha, 3, k.active, k.pending, k.dead, k.base, MAX_STALLED, limit)

    def floor(self, limit: int) -> Any:
        """The sweep's reads and writes as bare core commands, pipelined."""
        k, r = self.keys, self.r
        now = int(r.time()[0]) * 1000 + 999
        ids = r.zrangebyscore(k.active, "-inf", now, start=0, num=limit)
        pipe = r.pipeline(transaction=False)
        deaths = 0
        for raw in ids:
            job = raw.decode()
            i = int(job)
            row = k.job(job)
            pipe.zrem(k.active, job)
            pipe.hincrby(row, "stalled", 1)
            if lapsed_dies(i):
                deaths += 1
                pipe.zadd(k.dead, {job: 0})
                pipe.hset(row, mapping={"state": "dead", "last_error": "stalled"})
            else:
                pipe.zadd(k.pending, {job: 0})
                pipe.hset(row, "state", "pending")
            if len(pipe) >= 4000:
                pipe.execute()
        if deaths:
            pipe.hincrby(k.metrics_failed, "count", deaths)
        pipe.execute()
        return ids


FLOOR_COMMANDS = ["zrangebyscore", "zrem", "hincrby", "zadd", "hset"]
CONTENDER_STATS = {"native": ["emq.sweep"], "lua": ["evalsha"], "floor": FLOOR_COMMANDS}


def check_swept(s: SweepSet, n: int) -> None:
    """Every contender must leave the same result: the first n lapsed jobs moved."""
    r, k = s.r, s.keys
    dead = sum(lapsed_dies(i) for i in range(n))
    got = (r.zcard(k.pending), r.zcard(k.dead), int(r.hget(k.metrics_failed, "count") or 0))
    if got != (n - dead, dead, dead):
        raise RuntimeError(f"sweep left pending/dead/failed = {got}, expected {(n - dead, dead, dead)}")


def bench_sweep_bulk(r: redis.Redis, sizes: Sizes) -> dict[str, Any]:
    r.flushall()
    s = SweepSet(r, "bulk", sizes.sweep_bulk, 0)
    runs: dict[str, Callable[[int], Any]] = {"native": s.native, "lua": s.lua, "floor": s.floor}
    per_job: dict[str, list[float]] = {name: [] for name in runs}
    for rnd in range(sizes.rounds):
        for name in rotate(list(runs), rnd):
            s.reset()
            reset_stats(r)
            runs[name](sizes.sweep_bulk)
            _, usec = server_usec(r, CONTENDER_STATS[name])
            check_swept(s, sizes.sweep_bulk)
            per_job[name].append(usec / sizes.sweep_bulk)
    return _sweep_summary(per_job)


def _sweep_summary(per_job: dict[str, list[float]]) -> dict[str, Any]:
    return {
        "usec_per_job": per_job,
        "lua_over_native": [lu / n for n, lu in zip(per_job["native"], per_job["lua"], strict=True)],
        "native_over_floor": [n / f for n, f in zip(per_job["native"], per_job["floor"], strict=True)],
    }


def slowlog_usec(r: redis.Redis, command: bytes) -> list[float]:
    entries = r.slowlog_get(100_000)
    return [float(e["duration"]) for e in entries if e["command"].split(b" ")[0].upper() == command]


def bench_sweep_limit(r: redis.Redis, sizes: Sizes) -> dict[str, Any]:
    r.flushall()
    swept = LIMIT * sizes.limit_calls
    big = SweepSet(r, "big", swept, sizes.limit_members - swept)
    small = SweepSet(r, "small", swept, sizes.limit_small_members - swept)
    r.config_set("slowlog-log-slower-than", 0)
    r.config_set("slowlog-max-len", 1000 * sizes.limit_calls)
    runs: dict[str, Callable[[int], Any]] = {"native": big.native, "lua": big.lua, "floor": big.floor}
    per_job: dict[str, list[float]] = {name: [] for name in runs}
    call_usec: dict[str, list[float]] = {"native": [], "lua": [], "native_small": []}
    roundtrip_usec: list[float] = []
    try:
        for rnd in range(sizes.rounds):
            for name in rotate([*runs, "native_small"], rnd):
                s = small if name == "native_small" else big
                s.reset()
                reset_stats(r)
                run = s.native if name == "native_small" else runs[name]
                for _ in range(sizes.limit_calls):
                    t0 = time.perf_counter()
                    run(LIMIT)
                    if name == "native":
                        roundtrip_usec.append((time.perf_counter() - t0) * 1e6)
                check_swept(s, swept)
                if name != "native_small":
                    _, usec = server_usec(r, CONTENDER_STATS[name])
                    per_job[name].append(usec / swept)
                if name != "floor":
                    call_usec[name] += slowlog_usec(r, b"EVALSHA" if name == "lua" else b"EMQ.SWEEP")
    finally:
        r.config_set("slowlog-log-slower-than", 10_000)
        r.config_set("slowlog-max-len", 128)
    out = _sweep_summary(per_job)
    out["call_usec"] = {
        name: {"p50": percentile(v, 0.50), "p99": percentile(v, 0.99), "max": max(v), "n": len(v)}
        for name, v in call_usec.items()
    }
    out["roundtrip_usec_native"] = {
        "p50": percentile(roundtrip_usec, 0.5),
        "p99": percentile(roundtrip_usec, 0.99),
    }
    return out


# --------------------------------------------------------------------------
# 3. Python


def bench_python(r: redis.Redis, sizes: Sizes) -> dict[str, Any]:
    r.flushall()
    keys: QueueKeys = queue_keys("py")
    jobs = max(sizes.py_batch, 1000)
    r.eval(POPULATE_LIVE, 1, keys.active, jobs, keys.base, server_ms(r) + 3_600_000)
    client = echomq.Client(r)
    ids = [f"{i:012d}" for i in range(jobs)]
    rows = [keys.job(i) for i in ids]
    rng = random.Random(5)
    order = [rng.randrange(jobs) for _ in range(sizes.py_calls)]

    def raw() -> None:
        for i in order:
            r.execute_command("EMQ.EXTEND", keys.active, rows[i], ids[i], 1, LEASE_MS)

    def wrapped() -> None:
        for i in order:
            client.extend("py", ids[i], "1", LEASE_MS)

    batch = [(ids[i], "1") for i in range(sizes.py_batch)]
    batches = max(1, sizes.py_calls // sizes.py_batch)

    def one_by_one() -> None:
        for _ in range(batches):
            for job_id, token in batch:
                client.extend("py", job_id, token, LEASE_MS)

    def many() -> None:
        for _ in range(batches):
            outcomes = client.extend_many("py", batch, LEASE_MS)
            if any(o is not echomq.ExtendOutcome.OK for o in outcomes):
                raise RuntimeError(f"extend_many: {outcomes}")

    runs: dict[str, Callable[[], None]] = {
        "raw": raw,
        "extend": wrapped,
        "one_by_one": one_by_one,
        "extend_many": many,
    }
    per_call: dict[str, list[float]] = {name: [] for name in runs}
    for _ in range(2):  # warm the connection and the caches
        raw(), wrapped()
    for rnd in range(2 * sizes.rounds + 1):
        for name in rotate(list(runs), rnd):
            t0 = time.perf_counter_ns()
            runs[name]()
            elapsed = time.perf_counter_ns() - t0
            n = sizes.py_calls if name in ("raw", "extend") else batches * sizes.py_batch
            per_call[name].append(elapsed / n / 1000)
    return {
        "usec_per_job": per_call,
        "extend_over_raw": [e / w for e, w in zip(per_call["extend"], per_call["raw"], strict=True)],
        "one_by_one_over_many": [
            o / m for o, m in zip(per_call["one_by_one"], per_call["extend_many"], strict=True)
        ],
        "batch": sizes.py_batch,
    }


# --------------------------------------------------------------------------
# Report


def goals(res: dict[str, Any]) -> list[tuple[str, str, str, bool]]:
    ex, bulk, lim, py = res["extend"], res["sweep_bulk"], res["sweep_limit"], res["python"]
    rows: list[tuple[str, str, str, bool]] = []

    def add(name: str, value: float, target: str, held: bool, unit: str = "x") -> None:
        rows.append((name, f"{value:.2f}{unit}", target, held))

    v = median(ex["throughput_vs_zadd"])
    add("EXTEND throughput / bare ZADD throughput", v, ">= 0.90x", v >= 0.90)
    v = median(ex["lua_cpu_over_native"])
    add("EXTEND server CPU per call: Lua / native", v, ">= 5x", v >= 5.0)
    for label, sw in (("100k in one call", bulk), ("limit 100, 1M active", lim)):
        v = median(sw["lua_over_native"])
        add(f"SWEEP {label}: Lua / native per swept job", v, ">= 2.0x", v >= 2.0)
        v = median(sw["native_over_floor"])
        add(f"SWEEP {label}: native / core-command floor", v, "<= 1.00x", v <= 1.0)
    calls = lim["call_usec"]
    big, small = calls["native"], calls["native_small"]
    scale = big["p50"] / small["p50"]
    n_big, n_small = res["sizes"]["limit_members"], res["sizes"]["limit_small_members"]
    add(
        f"SWEEP limit 100: p50 per call at {n_big:,} / at {n_small:,} active",
        scale,
        "<= 2x (O(log N + limit))",
        scale <= 2.0,
    )
    v = median(py["extend_over_raw"])
    add("Python client.extend / raw execute_command", v, "<= 1.10x", v <= 1.10)
    return rows


def fmt(values: list[float], digits: int = 2) -> str:
    return f"{median(values):.{digits}f}"


def markdown(res: dict[str, Any]) -> str:
    ex, bulk, lim, py = res["extend"], res["sweep_bulk"], res["sweep_limit"], res["python"]
    sz = res["sizes"]
    out = [
        f"EchoMQ benchmark, {res['date']}, `{res['command']}`",
        f"({res['server']}, {res['machine']}; medians of {sz['rounds']} interleaved rounds)",
        "",
        "| goal | measured | target | held |",
        "|---|---|---|---|",
    ]
    out += [f"| {n} | {v} | {t} | {'yes' if h else '**no**'} |" for n, v, t, h in goals(res)]
    out += [
        "",
        f"EXTEND (redis-benchmark -P 16 -c 50, {sz['extend_jobs']:,} live jobs, "
        f"{sz['extend_requests']:,} requests per run):",
        "",
        "| contender | requests/s | server usec/call |",
        "|---|---|---|",
    ]
    for name, label in (
        ("native", "EMQ.EXTEND"),
        ("lua", "seed Lua (EVALSHA)"),
        ("zadd", "bare ZADD (floor)"),
    ):
        out.append(f"| {label} | {fmt(ex[name]['rps'], 0)} | {fmt(ex[name]['usec_per_call'], 3)} |")
    out += [
        "",
        "SWEEP, server usec per swept job (commandstats; the floor sums ZRANGEBYSCORE, ZREM, "
        "HINCRBY, ZADD, HSET):",
        "",
        "| scenario | EMQ.SWEEP | seed Lua | core-command floor |",
        "|---|---|---|---|",
    ]
    for label, sw in (
        (f"{sz['sweep_bulk']:,} lapsed, one call", bulk),
        (f"limit 100 x {sz['limit_calls']}, {sz['limit_members']:,} active", lim),
    ):
        u = sw["usec_per_job"]
        out.append(f"| {label} | {fmt(u['native'], 3)} | {fmt(u['lua'], 3)} | {fmt(u['floor'], 3)} |")
    c = lim["call_usec"]
    out += [
        "",
        "SWEEP limit 100, server usec per call (SLOWLOG):",
        "",
        "| contender | p50 | p99 | max |",
        "|---|---|---|---|",
        f"| EMQ.SWEEP, {sz['limit_members']:,} active | {c['native']['p50']:.0f} | "
        f"{c['native']['p99']:.0f} | {c['native']['max']:.0f} |",
        f"| EMQ.SWEEP, {sz['limit_small_members']:,} active | {c['native_small']['p50']:.0f} | "
        f"{c['native_small']['p99']:.0f} | {c['native_small']['max']:.0f} |",
        f"| seed Lua, {sz['limit_members']:,} active | {c['lua']['p50']:.0f} | "
        f"{c['lua']['p99']:.0f} | {c['lua']['max']:.0f} |",
        f"| EMQ.SWEEP round trip from Python, {sz['limit_members']:,} active | "
        f"{lim['roundtrip_usec_native']['p50']:.0f} | {lim['roundtrip_usec_native']['p99']:.0f} | |",
        "",
        "Python, usec per job (wall clock, loopback):",
        "",
        "| call | usec |",
        "|---|---|",
        f"| raw execute_command('EMQ.EXTEND', ...) | {fmt(py['usec_per_job']['raw'], 1)} |",
        f"| client.extend(...) | {fmt(py['usec_per_job']['extend'], 1)} |",
        f"| client.extend(...) x {py['batch']} | {fmt(py['usec_per_job']['one_by_one'], 1)} |",
        f"| client.extend_many(..., {py['batch']} jobs) | {fmt(py['usec_per_job']['extend_many'], 1)} "
        f"({fmt(py['one_by_one_over_many'])}x faster) |",
    ]
    return "\n".join(out) + "\n"


SECTIONS = [
    "extend", "sweep", "python", "claimpath", "backends", "memory", "saturation", "peers", "flow", "unique",
    "instructions", "ticks", "workercost",
]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="small sizes: a smoke run, not a verdict")
    parser.add_argument(
        "--only",
        choices=SECTIONS,
        help="run one part (no verdict)",
    )
    parser.add_argument("--no-peers", action="store_true", help="skip the peers section (bench/peers)")
    peers.add_server_options(parser)
    parser.add_argument(
        "--baseline",
        metavar="REF",
        help="peers and idle workers: also measure the package at this git revision (before/after, one run)",
    )
    args = parser.parse_args(argv)
    peers.choose_server(args)  # every section's servers: $ECHOMQ_SERVER_BIN
    sizes = QUICK if args.quick else FULL
    command = (
        "make bench"
        if not (args.quick or args.only or args.engine or args.server_bin)
        else "bench/run.py " + " ".join(argv or sys.argv[1:])
    )

    RESULTS.mkdir(parents=True, exist_ok=True)
    if args.only == "peers":
        return run_peers(args.quick, command, args.baseline)
    if args.only == "claimpath":
        idle = idle_workers.main_section(args.quick, command, args.baseline)
        return claim_path.main_section(args.quick, command) | idle
    if args.only == "backends":
        return backends.main_section(args.quick, command)
    if args.only == "memory":
        return memory.main_section(args.quick, command)
    if args.only == "saturation":
        return saturation.main_section(args.quick, command)
    if args.only == "flow":
        return flow.main_section(args.quick, command)
    if args.only == "unique":
        return unique.main_section(args.quick, command)
    if args.only == "instructions":
        return instructions.main_section(args.quick, command)
    if args.only == "ticks":
        return ticks.main_section(args.quick, command)
    if args.only == "workercost":
        return worker_cost.main_section(args.quick, command)
    with EmbeddedServer(["--appendonly", "no"]) as server:
        r = server.client()
        # The 100,000-job sweep is measured on purpose: above the default emq.max-limit.
        r.config_set("emq.max-limit", 1_000_000)
        res: dict[str, Any] = {
            "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
            "command": command,
            "server": peers.server_label(r.info("server")),
            "machine": f"{platform.machine()}, {platform.python_implementation()} "
            f"{platform.python_version()}",
            "sizes": sizes.__dict__,
        }
        parts: list[tuple[str, Callable[[], dict[str, Any]]]] = [
            ("extend", lambda: bench_extend(server, r, sizes)),
            ("sweep_bulk", lambda: bench_sweep_bulk(r, sizes)),
            ("sweep_limit", lambda: bench_sweep_limit(r, sizes)),
            ("python", lambda: bench_python(r, sizes)),
        ]
        for name, run in parts:
            if args.only and not name.startswith(args.only):
                continue
            t0 = time.monotonic()
            print(f"bench: {name} ...", file=sys.stderr, flush=True)
            res[name] = run()
            print(f"bench: {name} done in {time.monotonic() - t0:.1f}s", file=sys.stderr, flush=True)

    stamp = datetime.datetime.now(datetime.timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    (RESULTS / f"{stamp}.json").write_text(json.dumps(res, indent=2))
    (RESULTS / "latest.json").write_text(json.dumps(res, indent=2))
    if args.only:
        print(json.dumps({k: v for k, v in res.items() if k not in ("sizes",)}, indent=2))
        return 0
    text = markdown(res)
    (RESULTS / f"{stamp}.md").write_text(text)
    (RESULTS / "latest.md").write_text(text)
    print(text, flush=True)
    claim_path.main_section(args.quick, command)
    idle_workers.main_section(args.quick, command, args.baseline)
    backends.main_section(args.quick, command)
    memory.main_section(args.quick, command)
    flow.main_section(args.quick, command)
    unique.main_section(args.quick, command)
    instructions.main_section(args.quick, command)
    worker_cost.main_section(args.quick, command)
    ticks.main_section(args.quick, command)
    saturated = saturation.main_section(args.quick, command)
    if args.no_peers:
        return saturated
    return run_peers(args.quick, command, args.baseline) | saturated


def run_peers(quick: bool, command: str, baseline: str | None = None) -> int:
    """The peers section: its own servers, its own results files (bench/results/peers-*)."""
    t0 = time.monotonic()
    print("bench: peers ...", file=sys.stderr, flush=True)
    res = peers.run(peers.QUICK if quick else peers.FULL, command=command, baseline=baseline)
    text = peers.markdown(res)
    peers.save(res, text)
    print(f"bench: peers done in {time.monotonic() - t0:.1f}s", file=sys.stderr, flush=True)
    print(text)
    return peers.exit_code(res)


if __name__ == "__main__":
    sys.exit(main())
