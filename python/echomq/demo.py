"""The demo: EMQ.EXTEND and EMQ.SWEEP on a server of its own.

Run with ``python -m echomq demo``.  It starts redis-server with emq.so on a
free loopback port, plays the lifecycle story on it (every step a real
command against the real module), prints a timeline stamped with the
server's clock, and stops the server.
"""

from __future__ import annotations

import sys
import threading
import time
from typing import TextIO

import redis

from ._protocol import text as _text
from .cancel import CancelToken
from .client import Client
from .errors import LeaseLost, StaleToken
from .keyspace import queue_keys
from .server import EmbeddedServer

QUEUE = "demo"


class Timeline:
    def __init__(self, r: redis.Redis, out: TextIO) -> None:
        self.r, self.out = r, out
        seconds, micros = r.time()
        self.start = int(seconds) * 1000 + int(micros) // 1000

    def now(self) -> int:
        seconds, micros = self.r.time()
        return int(seconds) * 1000 + int(micros) // 1000

    def say(self, who: str, what: str) -> None:
        self.out.write(f"  t+{self.now() - self.start:>6} ms  {who:<10} {what}\n")
        self.out.flush()


def claim(r: redis.Redis, job_id: str, lease_ms: int, now: int) -> int:
    """Stand-in for the claim verb: bump attempts (the new token) and lease the job."""
    keys = queue_keys(QUEUE)
    pipe = r.pipeline(transaction=True)
    pipe.hincrby(keys.job(job_id), "attempts", 1)
    pipe.hset(keys.job(job_id), "state", "active")
    pipe.zrem(keys.pending, job_id)
    pipe.zadd(keys.active, {job_id: now + lease_ms})
    token = int(pipe.execute()[0])
    return token


def complete(r: redis.Redis, job_id: str) -> None:
    """Stand-in for the complete verb: the job leaves the active set, done."""
    keys = queue_keys(QUEUE)
    pipe = r.pipeline(transaction=True)
    pipe.zrem(keys.active, job_id)
    pipe.hset(keys.job(job_id), "state", "done")
    pipe.execute()


def run(out: TextIO = sys.stdout) -> dict[str, int]:
    with EmbeddedServer() as server:
        r = server.client(decode_responses=True)
        client = Client(r)
        keys = queue_keys(QUEUE)
        tl = Timeline(r, out)
        out.write(f"redis-server on {server.url} with --loadmodule {server.module}\n\n")

        for job in ("report", "resize", "poison", "export"):
            r.hset(keys.job(job), mapping={"state": "pending", "attempts": 0})
            r.zadd(keys.pending, {job: time.time()})
        tl.say("producer", "enqueued report, resize, poison, export")

        # 1. A live worker checkpoints its lease while it works.
        token = claim(r, "report", 300, tl.now())
        tl.say("worker-1", f"claimed report (token {token}, lease 300 ms)")
        for step in range(3):
            time.sleep(0.15)
            client.extend(QUEUE, "report", token, lease_ms=300)
            tl.say("worker-1", f"checkpoint {step + 1}: lease of report extended to now+300 ms")
        swept = client.sweep(QUEUE)
        tl.say("reaper", f"sweep: recovered={swept.recovered} dead={swept.dead} (report is alive)")
        complete(r, "report")
        tl.say("worker-1", "finished report")

        # 2. A worker dies holding a job; the sweep brings it back.
        dead_token = claim(r, "resize", 100, tl.now())
        tl.say("worker-2", f"claimed resize (token {dead_token}) ... and was killed")
        time.sleep(0.15)
        swept = client.sweep(QUEUE, max_stalled=2)
        tl.say("reaper", f"sweep: recovered={swept.recovered} dead={swept.dead}")
        try:
            client.extend(QUEUE, "resize", dead_token, lease_ms=300)
        except StaleToken as exc:
            tl.say("worker-2", f"came back and tried to extend: refused ({exc})")
        token = claim(r, "resize", 300, tl.now())
        tl.say("worker-3", f"claimed resize again (token {token}); the old token {dead_token} is now stale")
        client.extend(QUEUE, "resize", token, lease_ms=300)
        complete(r, "resize")
        tl.say("worker-3", "checkpointed and finished resize")

        # 3. A poison job kills every worker that takes it: dead after max-stalled stalls.
        for attempt in (1, 2):
            claim(r, "poison", 50, tl.now())
            tl.say(f"worker-{3 + attempt}", "claimed poison ... and crashed")
            time.sleep(0.1)
            swept = client.sweep(QUEUE, max_stalled=2)
            tl.say("reaper", f"sweep: recovered={swept.recovered} dead={swept.dead}")
        state, stalled = r.hmget(keys.job("poison"), ["state", "stalled"])
        tl.say("reaper", f"poison row: state={_text(state or '')} stalled={_text(stalled or '')}")

        # 4. Cooperative cancellation: the handler stops at its next check.
        cancel = CancelToken()
        token = claim(r, "export", 300, tl.now())
        progress: list[int] = []

        def handler() -> None:
            for chunk in range(1000):
                if cancel.check():
                    return
                progress.append(chunk)
                try:
                    client.extend(QUEUE, "export", token, lease_ms=300)
                except LeaseLost as exc:
                    cancel.cancel(f"lease lost: {exc}")
                cancel.sleep(0.02)

        worker = threading.Thread(target=handler)
        worker.start()
        time.sleep(0.1)
        cancel.cancel("operator asked to stop")
        worker.join()
        complete(r, "export")
        reason = cancel.check()
        tl.say("worker-6", f"export stopped after {len(progress)} chunks: {reason.reason if reason else '?'}")

        counts = {
            "pending": int(r.zcard(keys.pending)),
            "active": int(r.zcard(keys.active)),
            "dead": int(r.zcard(keys.dead)),
            "failed": int(r.hget(keys.metrics_failed, "count") or 0),
        }
        out.write("\nqueue counts: " + ", ".join(f"{k}={v}" for k, v in counts.items()) + "\n")
        return counts


if __name__ == "__main__":
    run()
