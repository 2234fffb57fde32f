"""What the module buys: every verb through EMQ.* and through its script, side by side.

    .venv/bin/python bench/run.py --only backends [--quick]     (also part of `make bench`)
    .venv/bin/python bench/backends.py [--quick]                (the same, alone)

One redis-server with emq.so loaded (echomq.testing.EmbeddedServer, no AOF, no replica):
for each verb, the same calls (the command lines `echomq._protocol` builds) go as the
module's command, as the library's function (FCALL, the scripts backend's way) and as a
script (EVALSHA, its fallback where the library may not be loaded), each on fresh data made
the same way, in pipelines of 100 (no MULTI).

- server microseconds per call: INFO commandstats ``usec_per_call`` after CONFIG
  RESETSTAT, of ``emq.<verb>`` for the module, of ``fcall`` or ``evalsha`` for the Lua --
  that line alone: the Lua's inner commands are counted on their own lines too, and
  their time is already inside the FCALL's or EVALSHA's;
- calls per second, wall clock from the client (loopback, one connection);
- a waiting claim (``claim(block_ms=...)``): the module waits on the server (no command
  while the queue is empty); the scripts backend polls (``echomq._scripts.ClaimPoll``).
  Idle commands per second of one waiting claimer, and enqueue-to-claim latency.

One run, interleaved per verb (module then scripts on fresh data each).  Results go to
bench/results/backends-*.{json,md} and are printed.
"""

from __future__ import annotations

import argparse
import datetime
import platform
import random
import statistics
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import redis  # noqa: E402

import echomq  # noqa: E402
from bench import _results as results  # noqa: E402
from echomq import _protocol as proto  # noqa: E402
from echomq import _scripts  # noqa: E402
from echomq.keyspace import queue_keys  # noqa: E402
from echomq.testing import EmbeddedServer  # noqa: E402

LEASE_MS = 600_000
PIPELINE = 100
LIMITS = _scripts.ScriptLimits()


@dataclass(frozen=True)
class Sizes:
    calls: int  # per verb and backend
    batch: int  # jobs per ENQUEUEMANY / SWEEP / RETRYDEAD / PURGE / OBLITERATE / FORGET call
    idle_window_s: float
    latency_jobs: int


FULL = Sizes(calls=5_000, batch=100, idle_window_s=5.0, latency_jobs=200)
QUICK = Sizes(calls=500, batch=50, idle_window_s=2.0, latency_jobs=40)


# -- one verb, both ways ---------------------------------------------------------------

Setup = Callable[[echomq.Client, str, int], list[proto.Call[Any]]]
"""Make the data for n calls on a queue (through the module: fast, the same for both) and
return the calls to measure."""


def enqueued(c: echomq.Client, q: str, n: int) -> list[str]:
    return c.enqueue_many(q, [(f"j{i:06}", b"payload") for i in range(n)])


def held(c: echomq.Client, q: str, n: int) -> list[echomq.Job]:
    enqueued(c, q, n)
    jobs: list[echomq.Job] = []
    while len(jobs) < n:
        jobs += c.claim_many(q, LEASE_MS, min(1000, n - len(jobs)))
    return jobs


def dead(c: echomq.Client, q: str, n: int) -> None:
    for job in held(c, q, n):
        c.fail(q, job.id, job.token, "boom", max_attempts=1)


def setups(sizes: Sizes) -> dict[str, Setup]:
    b = sizes.batch

    def then(first: object, calls: list[proto.Call[Any]]) -> list[proto.Call[Any]]:
        return calls  # `first` made the data

    return {
        "enqueue": lambda c, q, n: [proto.enqueue(q, b"payload", f"j{i:06}") for i in range(n)],
        "enqueuemany": lambda c, q, n: proto.enqueue_many(
            q, [(f"j{i:06}", b"payload") for i in range(n * b // 10)], chunk=b
        )[: n // 10],
        "claim": lambda c, q, n: then(enqueued(c, q, n), [proto.claim(q, LEASE_MS) for _ in range(n)]),
        "extend": lambda c, q, n: [proto.extend(q, j.id, j.token, LEASE_MS) for j in held(c, q, n)],
        "checkpoint": lambda c, q, n: [proto.checkpoint(q, j.id, j.token, LEASE_MS) for j in held(c, q, n)],
        "complete": lambda c, q, n: [proto.complete(q, j.id, j.token) for j in held(c, q, n)],
        "fail": lambda c, q, n: [proto.fail(q, j.id, j.token, "boom", 3) for j in held(c, q, n)],
        "release": lambda c, q, n: [proto.release(q, j.id, j.token) for j in held(c, q, n)],
        "cancel": lambda c, q, n: [proto.cancel(q, i, "stop") for i in enqueued(c, q, n)],
        "sweep": lambda c, q, n: then(
            lapse(c, q, held(c, q, n)), [proto.sweep(q, 3, b) for _ in range(n // b)]
        ),
        "retention": lambda c, q, n: [proto.retention(q) for _ in range(n)],
        "retry": lambda c, q, n: then(dead(c, q, n), [proto.retry(q, f"j{i:06}") for i in range(n)]),
        "retrydead": lambda c, q, n: then(dead(c, q, n), [proto.retry_dead(q, b) for _ in range(n // b)]),
        "purge": lambda c, q, n: then(dead(c, q, n), [proto.purge_dead(q, b) for _ in range(n // b)]),
        "pause": lambda c, q, n: [proto.pause(q) if i % 2 == 0 else proto.resume(q) for i in range(n)],
        "obliterate": lambda c, q, n: then(
            enqueued(c, q, n), [proto.obliterate(q, b, False) for _ in range(n // b)]
        ),
        "forget": lambda c, q, n: then(
            finish(c, q, n), [proto.forget(q, [f"j{i:06}" for i in range(k, k + b)]) for k in range(0, n, b)]
        ),
    }  # fmt: skip


def lapse(c: echomq.Client, q: str, jobs: list[echomq.Job]) -> None:
    pipe = c.redis.pipeline(transaction=False)
    for job in jobs:
        pipe.zadd(queue_keys(q).active, {job.id: 0})
    pipe.execute()


def finish(c: echomq.Client, q: str, n: int) -> None:
    for job in held(c, q, n):
        c.complete(q, job.id, job.token)


def measure(r: redis.Redis, rendering: _scripts.Rendering, calls: list[proto.Call[Any]]) -> dict[str, Any]:
    """Send the calls in pipelines; the server's time per call and the client's calls/s."""
    commands = [rendering.command(call.args) for call in calls]
    r.config_resetstat()
    t0 = time.perf_counter()
    for k in range(0, len(commands), PIPELINE):
        pipe = r.pipeline(transaction=False)
        for command in commands[k : k + PIPELINE]:
            pipe.execute_command(*command)
        for reply in pipe.execute(raise_on_error=False):
            if isinstance(reply, Exception):
                raise reply
    elapsed = time.perf_counter() - t0
    stats: dict[str, Any] = r.info("commandstats")
    if rendering.name == "scripts":
        lines = {"cmdstat_fcall" if rendering.mode == "functions" else "cmdstat_evalsha"}
    else:  # PAUSE and RESUME alternate: both lines
        lines = {"cmdstat_" + str(call.args[0]).lower() for call in calls}
    count = sum(int(stats[line]["calls"]) for line in lines)
    usec = sum(float(stats[line]["usec"]) for line in lines)
    assert count == len(commands), (lines, count, len(commands))
    return {"usec_per_call": usec / count, "calls_per_s": len(commands) / elapsed}


def bench_verbs(server: EmbeddedServer, sizes: Sizes) -> dict[str, Any]:
    r = server.client()
    for script in _scripts.scripts().values():
        r.script_load(script.source)
    r.function_load(_scripts.library().source, replace=True)
    setup_client = echomq.Client(r, backend="module")
    renderings = {
        "module": _scripts.Rendering("module", LIMITS),
        "functions": _scripts.Rendering("scripts", LIMITS, "functions"),
        "eval": _scripts.Rendering("scripts", LIMITS, "eval"),
    }
    out: dict[str, Any] = {}
    for verb, setup in setups(sizes).items():
        row: dict[str, Any] = {}
        for name, rendering in renderings.items():
            r.flushall()
            calls = setup(setup_client, f"{name}-{verb}", sizes.calls)
            row[name] = measure(r, rendering, calls)
            row[name]["calls"] = len(calls)
        row["cost"] = row["functions"]["usec_per_call"] / row["module"]["usec_per_call"]
        out[verb] = row
        print(f"bench: backends {verb}: module {row['module']['usec_per_call']:.2f} us, functions "
              f"{row['functions']['usec_per_call']:.2f} us, eval {row['eval']['usec_per_call']:.2f} us",
              file=sys.stderr, flush=True)  # fmt: skip
    r.close()
    return out


# -- a waiting claim -------------------------------------------------------------------------


def waiting_claim(server: EmbeddedServer, backend: str, sizes: Sizes) -> dict[str, Any]:
    r = server.client()
    client = echomq.Client(server.client(socket_timeout=None), backend=backend)  # type: ignore[arg-type]
    line = "cmdstat_fcall" if backend == "scripts" else "cmdstat_emq.claim"
    # Idle: one claimer waiting on an empty queue.
    stop = threading.Event()

    def idle() -> None:
        while not stop.is_set():
            client.claim(f"idle-{backend}", LEASE_MS, block_ms=1_000)

    t = threading.Thread(target=idle, daemon=True)
    t.start()
    time.sleep(0.5)
    r.config_resetstat()
    t0 = time.monotonic()
    time.sleep(sizes.idle_window_s)
    calls = int(r.info("commandstats").get(line, {}).get("calls", 0))
    per_s = calls / (time.monotonic() - t0)
    stop.set()
    t.join(5)
    # Enqueue to claim: jobs one at a time, 20-120 ms apart, while the claimer waits.
    latencies: list[float] = []
    producer = echomq.Client(server.client(), backend=backend)  # type: ignore[arg-type]
    q = f"lat-{backend}"

    def consume() -> None:
        while len(latencies) < sizes.latency_jobs:
            job = client.claim(q, LEASE_MS, block_ms=5_000)
            if job is not None:
                latencies.append((time.perf_counter_ns() - int(job.payload)) / 1e6)

    t = threading.Thread(target=consume, daemon=True)
    t.start()
    rng = random.Random(3)
    for _ in range(sizes.latency_jobs):
        time.sleep(0.02 + rng.random() * 0.1)
        producer.enqueue(q, str(time.perf_counter_ns()).encode())
    t.join(30)
    latencies.sort()
    r.close()
    return {
        "idle_commands_per_s": per_s,
        "latency_ms": {
            "p50": statistics.median(latencies),
            "p99": latencies[min(len(latencies) - 1, round(0.99 * (len(latencies) - 1)))],
            "max": latencies[-1],
        },
    }


# -- the report --------------------------------------------------------------------------


def run(sizes: Sizes, command: str) -> dict[str, Any]:
    with EmbeddedServer(["--appendonly", "no"]) as server:
        r = server.client()
        version = r.info("server")
        engine = f"valkey {version['valkey_version']}" if "valkey_version" in version else "redis"
        res: dict[str, Any] = {
            "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
            "command": command,
            "server": f"{engine} {version['redis_version']}".replace("redis redis", "redis"),
            "machine": f"{platform.machine()}, {platform.python_implementation()} "
            f"{platform.python_version()}",
            "sizes": sizes.__dict__,
            "verbs": bench_verbs(server, sizes),
            "waiting": {b: waiting_claim(server, b, sizes) for b in ("module", "scripts")},
        }
        r.close()
    return res


def markdown(res: dict[str, Any]) -> str:
    lines = [
        f"EchoMQ backends, {res['date']}, `{res['command']}`",
        f"({res['server']}, {res['machine']}; one run, {res['sizes']['calls']} calls per verb and backend, "
        f"pipelines of {PIPELINE}; batch verbs take {res['sizes']['batch']} jobs per call).  Server us per "
        "call (commandstats: the EMQ.*, FCALL or EVALSHA line) and calls per second (client, loopback):",
        "",
        "| verb | module us | library (FCALL) us | x module | script (EVALSHA) us | module calls/s "
        "| library calls/s |",
        "|---|---|---|---|---|---|---|",
    ]
    for verb, row in res["verbs"].items():
        m, f, e = row["module"], row["functions"], row["eval"]
        lines.append(
            f"| {verb.upper()} | {m['usec_per_call']:.2f} | {f['usec_per_call']:.2f} | {row['cost']:.1f}x "
            f"| {e['usec_per_call']:.2f} | {m['calls_per_s']:,.0f} | {f['calls_per_s']:,.0f} |"
        )
    costs = sorted(row["cost"] for row in res["verbs"].values())
    lines += [
        "",
        f"Server time, library / module: median {statistics.median(costs):.2f}x, "
        f"from {costs[0]:.2f}x to {costs[-1]:.2f}x.",
        "",
        "A waiting claim (`claim(block_ms=...)`): the module waits on the server, the Lua backend polls "
        f"(1, 2, 4 ... {_scripts.ClaimPoll.MAX_PAUSE_MS} ms):",
        "",
        "| backend | idle commands/s (one waiting claimer) | enqueue-to-claim p50 | p99 | max |",
        "|---|---|---|---|---|",
    ]
    for backend, w in res["waiting"].items():
        lat = w["latency_ms"]
        lines.append(
            f"| {backend} | {w['idle_commands_per_s']:.1f} | {lat['p50']:.2f} ms | {lat['p99']:.2f} ms "
            f"| {lat['max']:.2f} ms |"
        )
    return "\n".join(lines) + "\n"



def main_section(quick: bool, command: str) -> int:
    res = run(QUICK if quick else FULL, command)
    text = markdown(res)
    results.save("backends", res, text)
    print(text, flush=True)
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="small sizes: a smoke run, not a verdict")
    args = parser.parse_args(argv)
    return main_section(args.quick, "bench/backends.py" + (" --quick" if args.quick else ""))


if __name__ == "__main__":
    sys.exit(main())
