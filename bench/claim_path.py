"""The claim path's numbers (issues 14 and 18): waiting claims, delays, batch enqueue.

    .venv/bin/python bench/run.py --only claimpath [--quick]     (also part of `make bench`)
    .venv/bin/python bench/claim_path.py [--quick]               (the same, alone)

Each measurement gets a fresh redis-server of its own (echomq.testing.EmbeddedServer,
emq.so loaded) on loopback:

a. Idle commands per second of a worker with 8 slots (threads), each looping on a
   claim the way a worker does: "before" polls (claim, and 0.2 s of sleep when it
   found nothing, as today's Worker); "after" waits on the server
   (claim(block_ms=B)).  Counted by the server (INFO commandstats, EMQ.CLAIM calls)
   over a window of an empty queue.  Target: at most one command per B per slot.
b. Enqueue-to-claim latency: one claimer waiting (claim(block_ms=...)) in a loop,
   jobs enqueued one at a time; the payload carries the enqueue's perf_counter_ns
   (same process, same clock); latency = when claim() returned it - that.  The
   polling claimer (0.2 s sleep) for comparison.
c. Delayed-job lateness: jobs enqueued with delays spread over a few seconds,
   four claimers waiting; lateness = the row's claimed_at - its due time
   (enqueued_at + delay), both read by the server from its own clock.
   Target: p99 <= 50 ms.
d. Batch enqueue: N jobs by one client.enqueue() per job, by a pipeline of
   EMQ.ENQUEUE (1,000 per round trip, no MULTI), and by client.enqueue_many()
   (EMQ.ENQUEUEMANY, 10,000 per call).  Jobs per second, wall clock.
   Target (issue 18): enqueue_many >= 5x one call per job.
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
from echomq.keyspace import queue_keys  # noqa: E402
from echomq.testing import EmbeddedServer  # noqa: E402

LEASE_MS = 60_000
SLOTS = 8
POLL_S = 0.2


@dataclass(frozen=True)
class Sizes:
    idle_window_s: float
    block_ms: int
    latency_jobs: int
    poll_latency_jobs: int
    delayed_jobs: int
    delay_spread_ms: int
    enqueue_jobs: int
    rounds: int


FULL = Sizes(
    idle_window_s=10.0,
    block_ms=2_000,
    latency_jobs=1_000,
    poll_latency_jobs=50,
    delayed_jobs=500,
    delay_spread_ms=5_000,
    enqueue_jobs=20_000,
    rounds=3,
)
QUICK = Sizes(
    idle_window_s=4.0,
    block_ms=1_000,
    latency_jobs=200,
    poll_latency_jobs=20,
    delayed_jobs=100,
    delay_spread_ms=2_000,
    enqueue_jobs=5_000,
    rounds=1,
)


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    if not ordered:
        return float("nan")
    return ordered[min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))]


def summary(values: list[float]) -> dict[str, float]:
    return {
        "n": len(values),
        "p50": percentile(values, 0.5),
        "p99": percentile(values, 0.99),
        "max": max(values) if values else float("nan"),
        "mean": statistics.fmean(values) if values else float("nan"),
    }


def claim_calls(r: redis.Redis) -> int:
    stats: dict[str, Any] = r.info("commandstats")
    return int(stats.get("cmdstat_emq.claim", {}).get("calls", 0))


def fresh_server() -> EmbeddedServer:
    """A server for one measurement (started by `with`)."""
    return EmbeddedServer(["--appendonly", "no"])


# --------------------------------------------------------------------------
# a. idle commands per second


def idle_rate(mode: str, sizes: Sizes) -> dict[str, Any]:
    """EMQ.CLAIM calls per second from SLOTS idle loops on an empty queue.

    "block": claim(block_ms=sizes.block_ms) on connections without a socket
    timeout (one command per wait); "block-default": claim(block_ms=30000) on
    redis-py's default connection (socket_timeout 5 s), which the client cuts
    into commands of 4 s (see Client.claim).
    """
    with fresh_server() as server:
        r = server.client()
        stop = threading.Event()
        timeout: dict[str, Any] = {} if mode == "block-default" else {"socket_timeout": None}
        client = echomq.Client(server.client(max_connections=SLOTS + 2, **timeout))
        block_ms = 30_000 if mode == "block-default" else sizes.block_ms

        def slot() -> None:
            while not stop.is_set():
                if mode == "poll":
                    if client.claim("idle", LEASE_MS) is None:
                        stop.wait(POLL_S)
                else:
                    client.claim("idle", LEASE_MS, block_ms=block_ms)

        threads = [threading.Thread(target=slot, daemon=True) for _ in range(SLOTS)]
        for t in threads:
            t.start()
        time.sleep(1.0)  # every slot in its loop
        before, t0 = claim_calls(r), time.monotonic()
        time.sleep(sizes.idle_window_s)
        calls, elapsed = claim_calls(r) - before, time.monotonic() - t0
        stop.set()
        # Wake the waiting slots so the threads end: one job each.
        client.enqueue_many("idle", [b""] * SLOTS)
        for t in threads:
            t.join(10)
        return {"mode": mode, "calls": calls, "seconds": elapsed, "per_second": calls / elapsed}


# --------------------------------------------------------------------------
# b. enqueue-to-claim latency


def claim_latency(mode: str, jobs: int, sizes: Sizes) -> dict[str, Any]:
    with fresh_server() as server:
        producer = echomq.Client(server.client())
        consumer = echomq.Client(server.client(socket_timeout=None))
        latencies: list[float] = []
        done = threading.Event()

        def consume() -> None:
            while len(latencies) < jobs:
                if mode == "poll":
                    job = consumer.claim("lat", LEASE_MS)
                    if job is None:
                        time.sleep(POLL_S)
                        continue
                else:
                    job = consumer.claim("lat", LEASE_MS, block_ms=10_000)
                    if job is None:
                        continue
                got = time.perf_counter_ns()
                latencies.append((got - int(job.payload)) / 1e6)
                consumer.complete("lat", job.id, job.token)
            done.set()

        t = threading.Thread(target=consume, daemon=True)
        t.start()
        time.sleep(0.3)
        rng = random.Random(1)
        for _ in range(jobs):
            # Spaced out so the claimer is waiting again when the next job comes.
            time.sleep(0.002 + rng.random() * (0.004 if mode == "block" else 0.25))
            producer.enqueue("lat", str(time.perf_counter_ns()).encode())
        done.wait(60)
        return {"mode": mode, "ms": summary(latencies)}


# --------------------------------------------------------------------------
# c. delayed-job lateness


def delayed_lateness(sizes: Sizes, claimers: int = 4) -> dict[str, Any]:
    with fresh_server() as server:
        r = server.client()
        client = echomq.Client(server.client(socket_timeout=None, max_connections=claimers + 2))
        keys = queue_keys("delayed")
        rng = random.Random(2)
        delays = {}
        stop = threading.Event()
        claimed: list[str] = []
        lock = threading.Lock()

        def claimer() -> None:
            while not stop.is_set():
                job = client.claim("delayed", LEASE_MS, block_ms=1_000)
                if job is not None:
                    with lock:
                        claimed.append(job.id)

        threads = [threading.Thread(target=claimer, daemon=True) for _ in range(claimers)]
        for t in threads:
            t.start()
        time.sleep(0.3)
        for i in range(sizes.delayed_jobs):
            delay = 100 + rng.randrange(sizes.delay_spread_ms)
            job_id = client.enqueue("delayed", b"", job_id=f"d{i}", delay_ms=delay)
            delays[job_id] = delay
            time.sleep(0.001)
        deadline = time.monotonic() + sizes.delay_spread_ms / 1000 + 10
        while len(claimed) < sizes.delayed_jobs and time.monotonic() < deadline:
            time.sleep(0.05)
        stop.set()
        for t in threads:
            t.join(3)
        late: list[float] = []
        for job_id, delay in delays.items():
            row = r.hmget(keys.job(job_id), "enqueued_at", "claimed_at")
            if row[1] is None:
                continue
            late.append(int(row[1]) - (int(row[0]) + delay))
        return {
            "claimers": claimers,
            "jobs": sizes.delayed_jobs,
            "claimed": len(late),
            "early": sum(1 for x in late if x < 0),
            "ms": summary([float(x) for x in late]),
        }


# --------------------------------------------------------------------------
# d. batch enqueue


def enqueue_rates(sizes: Sizes) -> dict[str, Any]:
    n = sizes.enqueue_jobs
    payload = b"x" * 64
    with fresh_server() as server:
        r = server.client()
        client = echomq.Client(r)
        keys = queue_keys("enq")

        def one_by_one() -> None:
            for _ in range(n):
                client.enqueue("enq", payload)

        def pipelined() -> None:
            for start in range(0, n, 1000):
                pipe = r.pipeline(transaction=False)
                for i in range(start, min(n, start + 1000)):
                    pipe.execute_command("EMQ.ENQUEUE", keys.pending, keys.base, f"p{i}-{start}", payload)
                pipe.execute()

        def batched() -> None:
            client.enqueue_many("enq", [payload] * n)

        runs: dict[str, Callable[[], None]] = {
            "one_call_per_job": one_by_one,
            "pipelined_enqueue": pipelined,
            "enqueue_many": batched,
        }
        rates: dict[str, list[float]] = {name: [] for name in runs}
        for rnd in range(sizes.rounds):
            names = list(runs)
            names = names[rnd % len(names) :] + names[: rnd % len(names)]
            for name in names:
                r.flushall()
                t0 = time.perf_counter()
                runs[name]()
                elapsed = time.perf_counter() - t0
                pending = client.counts("enq").pending
                if pending != n:
                    raise RuntimeError(f"{name}: {pending} jobs pending, expected {n}")
                rates[name].append(n / elapsed)
        med = {name: statistics.median(v) for name, v in rates.items()}
        return {
            "jobs": n,
            "jobs_per_second": rates,
            "median": med,
            "many_over_one": med["enqueue_many"] / med["one_call_per_job"],
            "many_over_pipelined": med["enqueue_many"] / med["pipelined_enqueue"],
        }


# --------------------------------------------------------------------------
# report


def run(sizes: Sizes, command: str) -> dict[str, Any]:
    res: dict[str, Any] = {
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "command": command,
        "machine": f"{platform.machine()}, {platform.python_implementation()} {platform.python_version()}",
        "sizes": sizes.__dict__,
    }
    with fresh_server() as server:
        res["server"] = "redis-server " + server.client().info("server")["redis_version"]
    steps: list[tuple[str, Callable[[], Any]]] = [
        ("idle_poll", lambda: idle_rate("poll", sizes)),
        ("idle_block", lambda: idle_rate("block", sizes)),
        ("idle_block_default", lambda: idle_rate("block-default", sizes)),
        ("latency_block", lambda: claim_latency("block", sizes.latency_jobs, sizes)),
        ("latency_poll", lambda: claim_latency("poll", sizes.poll_latency_jobs, sizes)),
        ("lateness", lambda: delayed_lateness(sizes)),
        ("enqueue", lambda: enqueue_rates(sizes)),
    ]
    for name, step in steps:
        t0 = time.monotonic()
        print(f"bench: claim path {name} ...", file=sys.stderr, flush=True)
        res[name] = step()
        print(f"bench: claim path {name} done in {time.monotonic() - t0:.1f}s", file=sys.stderr, flush=True)
    return res


def goals(res: dict[str, Any]) -> list[tuple[str, str, str, bool]]:
    sz = res["sizes"]
    idle_target = SLOTS / (sz["block_ms"] / 1000)
    rows = [
        (
            f"idle EMQ.CLAIM/s, {SLOTS} slots waiting (BLOCK {sz['block_ms']} ms)",
            f"{res['idle_block']['per_second']:.2f}",
            f"<= {idle_target:.2f} (one per wait per slot)",
            res["idle_block"]["per_second"] <= idle_target * 1.05,
        ),
        (
            "delayed job claimed after its due time, p99",
            f"{res['lateness']['ms']['p99']:.0f} ms",
            "<= 50 ms",
            res["lateness"]["ms"]["p99"] <= 50,
        ),
        (
            "batch enqueue (enqueue_many) / one call per job",
            f"{res['enqueue']['many_over_one']:.1f}x",
            ">= 5x",
            res["enqueue"]["many_over_one"] >= 5,
        ),
    ]
    return rows


def markdown(res: dict[str, Any]) -> str:
    sz = res["sizes"]
    lat_b, lat_p = res["latency_block"]["ms"], res["latency_poll"]["ms"]
    late, enq = res["lateness"], res["enqueue"]
    out = [
        f"EchoMQ claim path, {res['date']}, `{res['command']}`",
        f"({res['server']}, {res['machine']}; loopback, one fresh server per measurement)",
        "",
        "| goal | measured | target | held |",
        "|---|---|---|---|",
    ]
    out += [f"| {n} | {v} | {t} | {'yes' if h else '**no**'} |" for n, v, t, h in goals(res)]
    out += [
        "",
        f"Idle worker, {SLOTS} slots, empty queue, EMQ.CLAIM calls counted by the server over "
        f"{res['idle_block']['seconds']:.1f} s:",
        "",
        "| loop | commands/s |",
        "|---|---|",
        f"| before: claim, then {POLL_S} s sleep when empty (today's Worker) | "
        f"{res['idle_poll']['per_second']:.1f} |",
        f"| after: claim(block_ms={sz['block_ms']}), socket_timeout=None | "
        f"{res['idle_block']['per_second']:.2f} |",
        "| after: claim(block_ms=30000), redis-py's default socket_timeout (5 s: waits of 4 s) | "
        f"{res['idle_block_default']['per_second']:.2f} |",
        "",
        "Enqueue-to-claim latency, one claimer, ms (perf_counter in one process):",
        "",
        "| claimer | jobs | p50 | p99 | max |",
        "|---|---|---|---|---|",
        f"| claim(block_ms=10000) waiting | {lat_b['n']} | {lat_b['p50']:.2f} | {lat_b['p99']:.2f} | "
        f"{lat_b['max']:.2f} |",
        f"| polling, {POLL_S} s sleep | {lat_p['n']} | {lat_p['p50']:.1f} | {lat_p['p99']:.1f} | "
        f"{lat_p['max']:.1f} |",
        "",
        f"Delayed jobs ({late['jobs']}, delays 100..{100 + sz['delay_spread_ms']} ms, {late['claimers']} "
        "claimers waiting): claimed_at - due, server ms:",
        "",
        "| p50 | p99 | max | claimed | before due |",
        "|---|---|---|---|---|",
        f"| {late['ms']['p50']:.0f} | {late['ms']['p99']:.0f} | {late['ms']['max']:.0f} | "
        f"{late['claimed']}/{late['jobs']} | {late['early']} |",
        "",
        f"Enqueue, {enq['jobs']:,} jobs of 64 bytes, jobs/s (median of {sz['rounds']}):",
        "",
        "| how | jobs/s | vs one call per job |",
        "|---|---|---|",
    ]
    one = enq["median"]["one_call_per_job"]
    for name, label in (
        ("one_call_per_job", "client.enqueue() per job"),
        ("pipelined_enqueue", "EMQ.ENQUEUE pipelined, 1,000 per round trip"),
        ("enqueue_many", "client.enqueue_many() (EMQ.ENQUEUEMANY, 10,000 per call)"),
    ):
        v = enq["median"][name]
        out.append(f"| {label} | {v:,.0f} | {v / one:.1f}x |")
    return "\n".join(out) + "\n"



def main_section(quick: bool, command: str) -> int:
    res = run(QUICK if quick else FULL, command)
    text = markdown(res)
    results.save("claimpath", res, text)
    print(text, flush=True)
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="small sizes: a smoke run, not a verdict")
    args = parser.parse_args(argv)
    command = "bench/claim_path.py" + (" --quick" if args.quick else "")
    return main_section(args.quick, command)


if __name__ == "__main__":
    sys.exit(main())
