"""echomq-only measurements of the peers section: remote-cancel latency and enqueue rate.

1. Remote cancel: a worker process (contenders/echomq_cancel.py, sync threads
   or asyncio tasks) runs handlers that wait on their CancelToken; this
   process calls ``client.cancel(...)`` on each running job at a random moment
   and the worker reports when the handler's token was cancelled.  Latency =
   that moment - the moment just before ``client.cancel`` was called, both
   ``time.monotonic_ns()`` (CLOCK_MONOTONIC, shared by every process on the
   machine).  EMQ.CANCEL publishes the id on ``<base>cancel``; the worker
   holding the job is subscribed there and checkpoints the job at once,
   which delivers the reason (its periodic EMQ.CHECKPOINT, every lease/3,
   stays the fallback for a lost message); the lease is printed too.
2. Enqueue: N jobs with one ``client.enqueue`` per job, the same EMQ.ENQUEUE
   commands pipelined 100 per round trip, and the batch verb (EMQ.ENQUEUEMANY,
   through client.enqueue_many) that takes many jobs in one call.  Jobs/s, Redis CPU us/job and
   commands/job as in the drain table; each way on a fresh server.
"""

from __future__ import annotations

import collections
import random
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import redis

import echomq
from bench.peers.procs import ContenderError, Proc, server_stats
from echomq.keyspace import queue_keys
from echomq.testing import EmbeddedServer

HERE = Path(__file__).resolve().parent
CONTENDERS_DIR = HERE / "contenders"
QUEUE = "bench"
CANCEL_LEASE_MS = 3000
CANCEL_CONCURRENCY = 10
PIPELINE_DEPTH = 100
BATCH_SIZE = 100

Log = Callable[[str], None]


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    if not ordered:
        return float("nan")
    return ordered[min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))]


# --------------------------------------------------------------------------
# 1. Remote cancel: client.cancel(...) -> the handler's token


def cancel_latency(kind: str, samples: int, lease_ms: int, concurrency: int, log: Log) -> dict[str, Any]:
    interval_s = lease_ms / 3000.0  # the LeaseKeeper's default checkpoint interval
    rng = random.Random(18)
    latencies_ms: list[float] = []
    outcomes: collections.Counter[str] = collections.Counter()
    all_ids: list[str] = []
    with EmbeddedServer(["--appendonly", "no"]) as server:
        client = echomq.Client(server.client())
        argv = [
            sys.executable,
            str(CONTENDERS_DIR / "echomq_cancel.py"),
            "--url",
            server.url,
            "--kind",
            kind,
            "--concurrency",
            str(concurrency),
            "--lease-ms",
            str(lease_ms),
        ]
        proc = Proc(argv, CONTENDERS_DIR)
        try:
            proc.expect("ready", 60)
            while len(latencies_ms) < samples:
                batch = min(concurrency, samples - len(latencies_ms))
                ids = [client.enqueue(QUEUE, b"") for _ in range(batch)]
                all_ids += ids
                started: set[str] = set()
                while len(started) < batch:
                    ev = proc.next_event(30)
                    if ev["event"] == "started":
                        started.add(ev["id"])
                # Cancel each running job at a random moment over 1.5 checkpoint
                # intervals, so the samples cover every phase of the keeper's timer.
                offsets = sorted(rng.uniform(0, 1.5 * interval_s) for _ in ids)
                order = rng.sample(ids, len(ids))
                sent: dict[str, int] = {}
                t0 = time.monotonic()
                for job_id, offset in zip(order, offsets, strict=True):
                    delay = t0 + offset - time.monotonic()
                    if delay > 0:
                        time.sleep(delay)
                    sent[job_id] = time.monotonic_ns()
                    outcomes[client.cancel(QUEUE, job_id, "bench")] += 1
                delivered: dict[str, int] = {}
                deadline = time.monotonic() + 2 * lease_ms / 1000 + 10
                while len(delivered) < batch:
                    ev = proc.next_event(deadline - time.monotonic())
                    if ev["event"] == "delivered":
                        delivered[ev["id"]] = int(ev["t_ns"])
                latencies_ms += [(delivered[i] - sent[i]) / 1e6 for i in ids]
            proc.send("stop")
            stopped = proc.expect("stopped", 60)
        except ContenderError as exc:
            return {"kind": kind, "error": str(exc)}
        finally:
            proc.close()
        r = server.client()
        keys = queue_keys(QUEUE)
        pipe = r.pipeline(transaction=False)
        for job_id in all_ids:
            pipe.hget(keys.job(job_id), "state")
        states = collections.Counter(s.decode() if s else "missing" for s in pipe.execute())
    result = {
        "kind": kind,
        "samples": len(latencies_ms),
        "lease_ms": lease_ms,
        "checkpoint_interval_ms": interval_s * 1000,
        "delivery": "pushed on <base>cancel, then one EMQ.CHECKPOINT (fallback: every lease/3)",
        "p50_ms": percentile(latencies_ms, 0.50),
        "p99_ms": percentile(latencies_ms, 0.99),
        "max_ms": max(latencies_ms),
        "mean_ms": statistics.fmean(latencies_ms),
        "latencies_ms": latencies_ms,
        "cancel_outcomes": dict(outcomes),
        "final_states": dict(states),
        "worker_stats": stopped.get("stats"),
    }
    log(
        f"cancel latency, {kind} worker: p50 {result['p50_ms']:.1f} ms, p99 {result['p99_ms']:.1f} ms "
        f"({len(latencies_ms)} samples; rows {dict(states)})"
    )
    return result


# --------------------------------------------------------------------------
# 2. Enqueue rate


def enqueue_one_by_one(client: echomq.Client, ids: list[str]) -> bool:
    for job_id in ids:
        client.enqueue(QUEUE, b"", job_id)
    return True


def enqueue_pipelined(client: echomq.Client, ids: list[str]) -> bool:
    """The same EMQ.ENQUEUE commands, PIPELINE_DEPTH per round trip (not atomic together)."""
    keys = queue_keys(QUEUE)
    r: redis.Redis = client.redis  # type: ignore[assignment]
    for k in range(0, len(ids), PIPELINE_DEPTH):
        pipe = r.pipeline(transaction=False)
        for job_id in ids[k : k + PIPELINE_DEPTH]:
            pipe.execute_command("EMQ.ENQUEUE", keys.pending, keys.base, job_id, b"")
        pipe.execute()
    return True


# ---- the batch enqueue verb ----------------------------------------------------
# Client.enqueue_many (EMQ.ENQUEUEMANY, issue 18) with BATCH_SIZE jobs per call:
# items are (job_id, payload) pairs.  Returns False (the table says "not
# available yet") on a client without it.
def enqueue_batch(client: echomq.Client, ids: list[str]) -> bool:
    many = getattr(client, "enqueue_many", None)
    if many is None:
        return False
    for k in range(0, len(ids), BATCH_SIZE):
        many(QUEUE, [(job_id, b"") for job_id in ids[k : k + BATCH_SIZE]])
    return True


ENQUEUE_WAYS: dict[str, tuple[str, Callable[[echomq.Client, list[str]], bool]]] = {
    "one": ("one client.enqueue per job", enqueue_one_by_one),
    "pipelined": (f"EMQ.ENQUEUE pipelined, {PIPELINE_DEPTH} per round trip", enqueue_pipelined),
    "batch": (f"batch verb, {BATCH_SIZE} jobs per call", enqueue_batch),
}


def enqueue_rates(count: int, rounds: int, log: Log) -> dict[str, Any]:
    ids = [f"e{i:08d}" for i in range(count)]
    per: dict[str, list[dict[str, float]]] = {way: [] for way in ENQUEUE_WAYS}
    missing: dict[str, str] = {}
    for rnd in range(rounds):
        ways = list(ENQUEUE_WAYS)
        ways = ways[rnd % len(ways) :] + ways[: rnd % len(ways)]
        for way in ways:
            if way in missing:
                continue
            with EmbeddedServer(["--appendonly", "no"]) as server:
                r = server.client()
                client = echomq.Client(r)
                before = server_stats(r)
                t0 = time.perf_counter()
                available = ENQUEUE_WAYS[way][1](client, ids)
                wall = time.perf_counter() - t0
                after = server_stats(r)
                if not available:
                    missing[way] = "not available yet (no batch enqueue verb)"
                    continue
                pending = r.zcard(queue_keys(QUEUE).pending)
            per[way].append(
                {
                    "jobs_per_s": count / wall,
                    "redis_cpu_us_per_job": (after["cpu"] - before["cpu"]) * 1e6 / count,
                    "commands_per_job": (after["commands"] - before["commands"] - 1) / count,
                    "pending_after": pending,
                }
            )
    out: dict[str, Any] = {"count": count, "rounds": rounds, "ways": {}}
    for way, (label, _) in ENQUEUE_WAYS.items():
        if way in missing:
            out["ways"][way] = {"label": label, "missing": missing[way]}
            continue
        runs = per[way]
        row = {
            "label": label,
            "runs": runs,
            "all_enqueued": all(run["pending_after"] == count for run in runs),
        }
        for m in ("jobs_per_s", "redis_cpu_us_per_job", "commands_per_job"):
            row[m] = statistics.median(run[m] for run in runs)
        if per["one"] and way != "one":
            row["x_one"] = statistics.median(
                run["jobs_per_s"] / base["jobs_per_s"] for run, base in zip(runs, per["one"], strict=True)
            )
        out["ways"][way] = row
        log(f"enqueue, {label}: {row['jobs_per_s']:.0f} jobs/s")
    return out


# --------------------------------------------------------------------------


def run_all(cancel_samples: int, enqueue_jobs: int, rounds: int, log: Log) -> dict[str, Any]:
    return {
        "cancel": [
            cancel_latency(kind, cancel_samples, CANCEL_LEASE_MS, CANCEL_CONCURRENCY, log)
            for kind in ("async", "sync")
        ],
        "enqueue": enqueue_rates(enqueue_jobs, rounds, log),
    }


def markdown(ex: dict[str, Any]) -> list[str]:
    out = [
        "Remote cancel, from `client.cancel(...)` in another process until the handler's token is "
        "cancelled (CLOCK_MONOTONIC in both processes; jobs cancelled at random moments while running):",
        "",
        "| worker | delivery | samples | p50 ms | p99 ms | max ms | jobs ended |",
        "|---|---|---|---|---|---|---|",
    ]
    for c in ex["cancel"]:
        worker = "asyncio Worker, 10 tasks" if c["kind"] == "async" else "sync Worker, 10 threads"
        if "error" in c:
            out.append(f"| {worker} | **ERROR: {c['error']}** |  |  |  |  |  |")
            continue
        delivery = (
            f"pushed (pub/sub), fallback checkpoint every lease/3 "
            f"(lease {c['lease_ms']} ms: every {c['checkpoint_interval_ms']:.0f} ms)"
        )
        states = ", ".join(f"{n} {s}" for s, n in sorted(c["final_states"].items()))
        out.append(
            f"| {worker} | {delivery} | {c['samples']} | {c['p50_ms']:.1f} | {c['p99_ms']:.1f} "
            f"| {c['max_ms']:.1f} | {states} |"
        )
    en = ex["enqueue"]
    out += [
        "",
        f"Enqueue, {en['count']:,} jobs from one Python client (medians of {en['rounds']} interleaved "
        "round(s), a fresh server each):",
        "",
        "| way | jobs/s | x one call per job | Redis CPU us/job | commands/job |",
        "|---|---|---|---|---|",
    ]
    for row in en["ways"].values():
        if "missing" in row:
            out.append(f"| {row['label']} | {row['missing']} |  |  |  |")
            continue
        flag = "" if row["all_enqueued"] else " **(not all enqueued)**"
        ratio = f"{row['x_one']:.2f}x" if "x_one" in row else "1.00x"
        out.append(
            f"| {row['label']} | {row['jobs_per_s']:,.0f}{flag} | {ratio} "
            f"| {row['redis_cpu_us_per_job']:.1f} | {row['commands_per_job']:.2f} |"
        )
    return out
