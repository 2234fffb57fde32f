"""The soak: a queue that runs for a long time keeps its memory bounded (issue 13).

    .venv/bin/python bench/soak.py [--jobs 1000000] [--batch 1000] [--fail-share 0.02]
    make soak                              (the same, with the defaults)

Not part of `make bench` or the tests: it takes minutes.  On a fresh server
of its own (echomq.testing.EmbeddedServer, no persistence), with a short
retention (done and cancelled rows kept --retention-ms, default 1000 ms;
dead rows until retried), it sends --jobs jobs through

    enqueue -> claim -> complete
    (a --fail-share of them: -> fail -> dead -> retry (EMQ.RETRYDEAD) -> claim -> complete)

in batches (one pipeline of ENQUEUEs, one CLAIM COUNT, one pipeline of
COMPLETE/FAIL per batch, the operator's retry_dead every --retry-every
batches), then waits for the retention and the claims' leases to pass and
sweeps.  It prints `used_memory` before and after (and the peak), how long it
took, and checks the queue's invariant on every key at the end (and once
midway): echomq.testing.queue_problems, plus no key left but the queue's
settings and failed metric.  Exit status 0 only when the invariant holds and
the memory after is within --tolerance-mb of the memory before.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "python"))

import redis  # noqa: E402

import echomq  # noqa: E402
from echomq import _protocol as proto  # noqa: E402
from echomq.keyspace import queue_keys  # noqa: E402
from echomq.testing import EmbeddedServer, queue_problems  # noqa: E402

QUEUE = "soak"


def used_memory(r: redis.Redis) -> int:
    return int(r.info("memory")["used_memory"])


def mb(n: float) -> str:
    return f"{n / 2**20:.2f} MB"


def settle(r: redis.Redis, baseline: int, quiet_s: float = 3.0, timeout_s: float = 300.0) -> None:
    """Wait until the expired keys are gone and the keyspace's tables have shrunk
    (the server does both in its background cycles), i.e. until used_memory
    stops falling for `quiet_s` seconds."""
    deadline = time.monotonic() + timeout_s
    last, since = used_memory(r), time.monotonic()
    while time.monotonic() < deadline:
        time.sleep(0.25)
        now = used_memory(r)
        if now < last - 1024:
            last, since = now, time.monotonic()
        elif time.monotonic() - since >= quiet_s and r.dbsize() <= 2:
            return
    print(f"soak: memory still settling after {timeout_s:.0f} s (dbsize {r.dbsize()})", flush=True)


def run(args: argparse.Namespace) -> int:
    keys = queue_keys(QUEUE)
    with EmbeddedServer(["--appendonly", "no", "--save", ""]) as server:
        r = server.client()
        client = echomq.Client(r)
        version = r.info("server")["redis_version"]
        before = used_memory(r)
        policy = client.retention(QUEUE, done_ms=args.retention_ms, cancelled_ms=args.retention_ms)
        print(f"soak: redis-server {version}, {args.jobs:,} jobs, batch {args.batch}, fail share "
              f"{args.fail_share:.1%}, retention {policy}", flush=True)  # fmt: skip
        print(f"soak: used_memory before {mb(before)} ({before} bytes)", flush=True)

        t0 = time.monotonic()
        enqueued = completed = failed = retried = claims = 0
        failed_once: set[str] = set()
        fail_every = round(1 / args.fail_share) if args.fail_share > 0 else 0
        batches = 0
        checked_midway = False
        while completed < args.jobs:
            # enqueue a batch (while there are jobs left to enqueue)
            if enqueued < args.jobs:
                n = min(args.batch, args.jobs - enqueued)
                pipe = r.pipeline(transaction=False)
                for i in range(enqueued, enqueued + n):
                    call = proto.enqueue(QUEUE, b"payload-%d" % i, f"job-{i}")
                    pipe.execute_command(*call.args)
                pipe.execute()
                enqueued += n
            # claim a batch, finish it
            jobs = client.claim_many(QUEUE, lease_ms=args.lease_ms, count=args.batch)
            claims += 1
            pipe = r.pipeline(transaction=False)
            for job in jobs:
                number = int(job.id.rsplit("-", 1)[1])
                if fail_every and number % fail_every == 0 and job.id not in failed_once:
                    failed_once.add(job.id)
                    call = proto.fail(QUEUE, job.id, job.token, "soak failure", 1)
                    failed += 1
                else:
                    call = proto.complete(QUEUE, job.id, job.token)
                    completed += 1
                pipe.execute_command(*call.args)
            pipe.execute()
            batches += 1
            if batches % args.retry_every == 0 or (not jobs and r.zcard(keys.dead)):
                retried += client.retry_dead(QUEUE, limit=args.batch).retried
            if not checked_midway and completed >= args.jobs // 2:
                problems = queue_problems(r, QUEUE)
                checked_midway = True
                verdict = "holds" if not problems else problems[:5]
                where = f"{completed:,} done, {r.dbsize():,} keys, used_memory {mb(used_memory(r))}"
                print(f"soak: midway ({where}): invariant {verdict}", flush=True)
                if problems:
                    return 1
            if batches % 100 == 0:
                rate = completed / (time.monotonic() - t0)
                jobs_line = f"{completed:,} completed, {failed:,} failed, {retried:,} retried"
                keys_line = f"{r.dbsize():,} keys, used_memory {mb(used_memory(r))}, {rate:,.0f} jobs/s"
                print(f"soak: {jobs_line}, {keys_line}", flush=True)
        elapsed = time.monotonic() - t0
        counts = client.counts(QUEUE)
        peak = int(r.info("memory")["used_memory_peak"])

        # The retention and the claims' leases pass; a sweep runs; the server expires and shrinks.
        time.sleep(max(args.retention_ms, args.lease_ms) / 1000 + 0.5)
        swept = client.sweep(QUEUE, limit=1000)
        settle(r, before)
        after = used_memory(r)
        left = sorted(k.decode() for k in r.keys("*"))
        problems = queue_problems(r, QUEUE)
        expected_left = sorted([keys.meta, keys.metrics_failed])
        total = time.monotonic() - t0

        story = f"{completed:,} jobs completed ({failed:,} failed once, dead, and {retried:,} retried)"
        print(f"soak: {story} in {elapsed:.1f} s: {completed / elapsed:,.0f} jobs/s; {claims:,} claims")
        print(f"soak: at the end of the traffic: {counts}")
        print(f"soak: sweep after the retention: {len(swept)} lapsed, {swept.expired} dead rows expired")
        print(f"soak: used_memory before {mb(before)}, peak {mb(peak)}, after {mb(after)} "
              f"(after - before = {mb(after - before)}; {after - before} bytes)")  # fmt: skip
        print(f"soak: keys left {left}; failed metric {counts.failed:,}")
        print(f"soak: invariant on every key: {'holds' if not problems else problems[:10]}")
        print(f"soak: total {total:.1f} s (traffic {elapsed:.1f} s, then retention, sweep and settling)")
        ok = not problems and left == expected_left and abs(after - before) <= args.tolerance_mb * 2**20
        ok = ok and counts.pending == counts.active == counts.dead == 0 and retried == failed
        print(f"soak: {'OK' if ok else 'FAILED'}")
        return 0 if ok else 1


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, default=1_000_000)
    parser.add_argument("--batch", type=int, default=1000, help="jobs per enqueue pipeline and per claim")
    parser.add_argument(
        "--fail-share", type=float, default=0.02, help="jobs that fail once, die, and are retried"
    )
    parser.add_argument("--retry-every", type=int, default=20, help="batches between two retry_dead calls")
    parser.add_argument(
        "--retention-ms", type=int, default=1000, help="done and cancelled rows are kept this long"
    )
    parser.add_argument("--lease-ms", type=int, default=5000)
    parser.add_argument("--tolerance-mb", type=float, default=4.0, help="|after - before| allowed")
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
