"""What issue 28 changed, measured: how long one call holds the server, and bytes per job.

    .venv/bin/python bench/bounded.py [--module path/to/emq.so] [--jobs 200000] [--steps]

Two measurements, on a server of its own (EmbeddedServer, Debian's redis-server
unless $ECHOMQ_SERVER_BIN says otherwise):

1. **A whole queue deleted.**  `--jobs` waiting jobs (200,000), then the queue is
   obliterated while a second connection sends PING after PING; printed: the
   longest PING (how long the server was held), the longest single call and the
   total.  Without `--steps` it is one `EMQ.OBLITERATE ... <jobs>` (what a
   module before issue 28 accepted; a module after it refuses a limit above
   emq.max-limit); with `--steps`, `Client.obliterate(limit=emq.max-limit)`,
   the steps a client loops over.
2. **Bytes per waiting job** (`used_memory` before and after 20,000 jobs with
   76-byte payloads, as issue 34 counts them): enqueued one ENQUEUE each (as
   `Client.enqueue` sends them, with a REQ, pipelined) and by ENQUEUEMANY
   (`Client.enqueue_many`); then again once the enqueue records expired (a
   minute later, `--wait-records`).

Not part of `make bench`: it compares a module with an older build of itself
(`git archive <commit> module | tar -x -C /tmp/old && make -C /tmp/old/module`).
"""

from __future__ import annotations

import argparse
import threading
import time
from typing import Any

import redis

import echomq
from echomq import _protocol as proto
from echomq.testing import EmbeddedServer

PAYLOAD = b"x" * 76


def used(r: redis.Redis) -> int:
    return int(r.info("memory")["used_memory"])


def fill(client: echomq.Client, queue: str, jobs: int) -> None:
    for start in range(0, jobs, 10_000):
        client.enqueue_many(queue, [PAYLOAD] * min(10_000, jobs - start))


class Pinger(threading.Thread):
    """PING after PING on a connection of its own; the longest round trip seen."""

    def __init__(self, server: EmbeddedServer) -> None:
        super().__init__(daemon=True)
        self.r = server.client()
        self.longest = 0.0
        self.count = 0
        self.done = threading.Event()

    def run(self) -> None:
        while not self.done.is_set():
            sent = time.perf_counter()
            self.r.ping()
            self.longest = max(self.longest, time.perf_counter() - sent)
            self.count += 1


def obliterate(server: EmbeddedServer, jobs: int, steps: bool) -> dict[str, Any]:
    r = server.client()
    client = echomq.Client(r, backend="module")
    fill(client, "big", jobs)
    keys = proto.keys_of("big")
    pinger = Pinger(server)
    pinger.start()
    time.sleep(0.2)
    pinger.longest = 0.0
    longest_call = 0.0
    began = time.perf_counter()
    if steps:
        limit = int(r.config_get("emq.max-limit")["emq.max-limit"])
        remaining = 1
        while remaining:
            sent = time.perf_counter()
            _, remaining = client._run(proto.obliterate("big", limit, False))
            longest_call = max(longest_call, time.perf_counter() - sent)
    else:
        sent = time.perf_counter()
        r.execute_command("EMQ.OBLITERATE", keys.active, keys.pending, keys.dead, keys.base, jobs)
        longest_call = time.perf_counter() - sent
    total = time.perf_counter() - began
    pinger.done.set()
    pinger.join()
    assert not r.exists(keys.pending)  # a zset before v3, a list since: gone either way
    return {
        "longest PING ms": round(pinger.longest * 1000, 1),
        "longest call ms": round(longest_call * 1000, 1),
        "total ms": round(total * 1000, 1),
        "PINGs": pinger.count,
    }


def bytes_per_job(server: EmbeddedServer, jobs: int, wait_records: bool) -> dict[str, float]:
    r = server.client()
    client = echomq.Client(r, backend="module")
    client.enqueue("warm", b"x")
    out: dict[str, float] = {}
    before = used(r)
    pipe = r.pipeline(transaction=False)
    for i in range(jobs):
        pipe.execute_command(*proto.enqueue("single", PAYLOAD, None).args)
        if i % 1000 == 999:
            pipe.execute()
    pipe.execute()
    out["ENQUEUE"] = (used(r) - before) / jobs
    if wait_records:  # the enqueue records expire a minute after their calls
        time.sleep(proto.REQ_RECORD_TTL_S + 1)
        while r.scan(0, match="emq:*:req:*", count=100_000)[1]:
            time.sleep(0.5)
        out["ENQUEUE, records expired"] = (used(r) - before) / jobs
    before = used(r)
    client.enqueue_many("many", [PAYLOAD] * jobs)
    out["ENQUEUEMANY"] = (used(r) - before) / jobs
    return {k: round(v, 1) for k, v in out.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--module", default=None, help="emq.so to load (default: this checkout's)")
    parser.add_argument("--jobs", type=int, default=200_000)
    parser.add_argument("--steps", action="store_true", help="obliterate in emq.max-limit steps")
    parser.add_argument("--wait-records", action="store_true", help="measure again once the records expired")
    args = parser.parse_args()
    with EmbeddedServer(module=args.module) as server:
        print("obliterate", args.jobs, "jobs:", obliterate(server, args.jobs, args.steps), flush=True)
    with EmbeddedServer(module=args.module) as server:
        print("bytes per waiting job:", bytes_per_job(server, 20_000, args.wait_records), flush=True)


if __name__ == "__main__":
    main()
