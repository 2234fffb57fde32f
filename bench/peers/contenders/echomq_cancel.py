"""Cancel-latency worker: echomq's Worker whose handlers wait for their CancelToken.

Runs in the project's .venv.  The harness (bench/peers/extras.py) enqueues
jobs and cancels them from its own process with ``client.cancel(...)``; this
process reports, on the line protocol of protocol.py:

    {"event": "started", "id": ...}                  the handler is running
    {"event": "delivered", "id": ..., "t_ns": ...}   its token was cancelled

``t_ns`` is ``time.monotonic_ns()`` (CLOCK_MONOTONIC, one clock for every
process on the machine), taken when the handler wakes on its token.  The
handler then raises ``Cancelled`` so the job ends ``cancelled``.  On "stop"
the worker stops and the process exits.

Delivery today is the LeaseKeeper's EMQ.CHECKPOINT every lease/3: whatever
carries the cancel to the token, this process measures the same thing.
"""

from __future__ import annotations

import asyncio
import sys
import threading
import time
from typing import Any

import redis
import redis.asyncio as aioredis
from protocol import emit, parser

import echomq
import echomq.asyncio as emq_async

# ---- Worker options -------------------------------------------------------------
# None needed: a Worker listens on <base>cancel by itself (pushed cancels), and
# its checkpoint every lease/3 is the fallback.  The measurement
# (client.cancel -> the handler's token) is the same either way.
WORKER_OPTIONS: dict[str, Any] = {}

_lock = threading.Lock()


def say(event: str, **fields: Any) -> None:
    with _lock:  # handler threads share stdout
        emit(event, **fields)


def run_sync(a: Any) -> None:
    def handler(job: echomq.Job, cancel: echomq.CancelToken) -> None:
        say("started", id=job.id)
        cancel.sleep(3600)  # wakes the moment the token is cancelled
        if cancel.cancelled:
            say("delivered", id=job.id, t_ns=time.monotonic_ns())
        cancel.raise_if_cancelled()

    client = echomq.Client(redis.Redis.from_url(a.url))
    worker = echomq.Worker(
        client,
        a.queue,
        handler,
        lease_ms=a.lease_ms,
        concurrency=a.concurrency,
        **WORKER_OPTIONS,
    )
    worker.start()
    say("ready")
    for line in sys.stdin:
        if line.strip() == "stop":
            break
    worker.stop(grace=0)  # the old stop(): "shutdown" to running handlers at once
    say("stopped", stats=worker.stats.__dict__)


async def run_async(a: Any) -> None:
    async def handler(job: echomq.Job, cancel: echomq.CancelToken) -> None:
        say("started", id=job.id)
        await cancel.wait()
        say("delivered", id=job.id, t_ns=time.monotonic_ns())
        cancel.raise_if_cancelled()

    client = emq_async.Client(aioredis.Redis.from_url(a.url))
    worker = emq_async.Worker(
        client,
        a.queue,
        handler,
        lease_ms=a.lease_ms,
        concurrency=a.concurrency,
        **WORKER_OPTIONS,
    )
    task = asyncio.create_task(worker.run())
    say("ready")
    loop = asyncio.get_running_loop()
    while (await loop.run_in_executor(None, sys.stdin.readline)).strip() not in ("stop", ""):
        pass
    worker.stop(grace=0)  # the old stop(): "shutdown" to running handlers at once
    await task
    await client.aclose()
    say("stopped", stats=worker.stats.__dict__)


def main() -> None:
    p = parser(__doc__.splitlines()[0])
    p.set_defaults(n=0)
    p.add_argument("--kind", choices=["sync", "async"], required=True)
    p.add_argument("--lease-ms", type=int, default=3000)
    a = p.parse_args(["--n", "0", *sys.argv[1:]])
    try:
        if a.kind == "sync":
            run_sync(a)
        else:
            asyncio.run(run_async(a))
    except Exception as exc:
        emit("error", message=f"{type(exc).__name__}: {exc}")
        raise


if __name__ == "__main__":
    main()
