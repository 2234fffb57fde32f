"""echomq contender: the package's own Worker (sync threads or asyncio tasks), no-op handler.

Runs in the project's .venv (the package under test).  See protocol.py for
the conversation with the harness.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import redis
import redis.asyncio as aioredis
from protocol import Clock, emit, expect, parser, verdict

import echomq
import echomq.asyncio as emq_async
from echomq.keyspace import queue_keys

POLL_S = 0.002  # how often the contender looks at its worker's finish count


def finished(stats: echomq.WorkerStats) -> int:
    return stats.completed + stats.failed + stats.cancelled + stats.leases_lost + stats.rejected


def verify(url: str, queue: str, ids: list[str]) -> dict[str, Any]:
    """Every row's `state`, read back (the row is echomq's status API)."""
    r = redis.Redis.from_url(url)
    keys = queue_keys(queue)
    pipe = r.pipeline(transaction=False)
    for job_id in ids:
        pipe.hget(keys.job(job_id), "state")
    states = [s.decode() if s is not None else None for s in pipe.execute()]
    out = verdict(states, "done", ("dead",))
    out["errors"] = [
        f"{job_id}: {state}: {(r.hget(keys.job(job_id), 'last_error') or b'').decode(errors='replace')}"
        for job_id, state in zip(ids, states, strict=True)
        if state != "done"
    ][:3]
    out["pending_left"] = echomq.Client(r).counts(queue).pending
    out["active_left"] = r.zcard(keys.active)
    return out


def run_sync(
    url: str,
    n: int,
    queue: str,
    concurrency: int,
    timeout: float,
    prefetch: int = 0,
    enqueue: int | None = None,
    until_stop: bool = False,
) -> None:
    client = echomq.Client(redis.Redis.from_url(url))
    t = time.perf_counter()
    if enqueue is None:
        ids = [client.enqueue(queue, b"") for _ in range(n)]
    else:  # several processes (bench/saturation.py): the enqueue is not what is measured there
        ids = client.enqueue_many(queue, [b""] * enqueue)
    emit("ready", enqueued=len(ids), enqueue_s=time.perf_counter() - t)
    expect("go")
    clock = Clock()
    settings = {"prefetch": prefetch} if prefetch else {}  # older packages have no prefetch
    worker = echomq.Worker(
        echomq.Client(redis.Redis.from_url(url)),
        queue,
        lambda job, cancel: None,
        concurrency=concurrency,
        **settings,
    )
    worker.start()
    if until_stop:
        expect("stop")  # the worker's threads drain the shared queue meanwhile
    while not until_stop and finished(worker.stats) < n and clock.elapsed() < timeout:
        time.sleep(POLL_S)
    emit(
        "drained",
        elapsed_s=clock.elapsed(),
        processed=finished(worker.stats),
        timed_out=not until_stop and finished(worker.stats) < n,
    )
    expect("verify")
    worker.stop(grace=0)  # drained: nothing runs; 0 keeps the old stop-at-once
    emit("verified", **verify(url, queue, ids), stats=worker.stats.__dict__)


async def run_async(
    url: str,
    n: int,
    queue: str,
    concurrency: int,
    timeout: float,
    enqueue: int | None = None,
    until_stop: bool = False,
) -> None:
    client = emq_async.Client(aioredis.Redis.from_url(url))
    t = time.perf_counter()
    if enqueue is None:
        ids = [await client.enqueue(queue, b"") for _ in range(n)]
    else:  # several processes (bench/saturation.py): the enqueue is not what is measured there
        ids = await client.enqueue_many(queue, [b""] * enqueue)
    await client.aclose()
    emit("ready", enqueued=len(ids), enqueue_s=time.perf_counter() - t)
    expect("go")  # blocks the loop on purpose: nothing else runs yet
    clock = Clock()

    async def handler(job: echomq.Job, cancel: echomq.CancelToken) -> None:
        return None

    wclient = emq_async.Client(aioredis.Redis.from_url(url))
    worker = emq_async.Worker(wclient, queue, handler, concurrency=concurrency)
    task = asyncio.create_task(worker.run())
    if until_stop:
        await asyncio.to_thread(expect, "stop")  # the loop runs the worker meanwhile
    while not until_stop and finished(worker.stats) < n and clock.elapsed() < timeout:
        await asyncio.sleep(POLL_S)
    emit(
        "drained",
        elapsed_s=clock.elapsed(),
        processed=finished(worker.stats),
        timed_out=not until_stop and finished(worker.stats) < n,
    )
    expect("verify")  # blocking: the worker's tasks wait until the harness has read INFO
    worker.stop()
    await task
    await wclient.aclose()
    emit("verified", **verify(url, queue, ids), stats=worker.stats.__dict__)


def run_tasks(url: str, n: int, queue: str, concurrency: int, timeout: float) -> None:
    """The same no-op as a task (``@app.task``): enqueued by ``noop.enqueue()``, run by ``app.worker()``."""
    app = echomq.App(echomq.Client(redis.Redis.from_url(url)), queue=queue)

    @app.task
    def noop() -> None:
        return None

    t = time.perf_counter()
    ids = [noop.enqueue().id for _ in range(n)]
    emit("ready", enqueued=len(ids), enqueue_s=time.perf_counter() - t)
    expect("go")
    clock = Clock()
    workers = app.worker(concurrency=concurrency)
    (worker,) = workers.workers
    workers.start()
    while finished(worker.stats) < n and clock.elapsed() < timeout:
        time.sleep(POLL_S)
    emit("drained", elapsed_s=clock.elapsed(), processed=finished(worker.stats),
         timed_out=finished(worker.stats) < n)  # fmt: skip
    expect("verify")
    workers.stop(grace=0)
    emit("verified", **verify(url, queue, ids), stats=worker.stats.__dict__)


async def run_async_tasks(url: str, n: int, queue: str, concurrency: int, timeout: float) -> None:
    """``run_tasks`` with ``echomq.asyncio.App`` and an ``async def`` task."""
    client = emq_async.Client(aioredis.Redis.from_url(url))
    app = emq_async.App(client, queue=queue)

    @app.task
    async def noop() -> None:
        return None

    t = time.perf_counter()
    ids = [(await noop.enqueue()).id for _ in range(n)]
    emit("ready", enqueued=len(ids), enqueue_s=time.perf_counter() - t)
    expect("go")
    clock = Clock()
    workers = app.worker(concurrency=concurrency)
    (worker,) = workers.workers
    task = asyncio.create_task(workers.run(handle_signals=False))
    while finished(worker.stats) < n and clock.elapsed() < timeout:
        await asyncio.sleep(POLL_S)
    emit("drained", elapsed_s=clock.elapsed(), processed=finished(worker.stats),
         timed_out=finished(worker.stats) < n)  # fmt: skip
    expect("verify")
    workers.stop()
    await task
    await client.aclose()
    emit("verified", **verify(url, queue, ids), stats=worker.stats.__dict__)


def main() -> None:
    p = parser(__doc__.splitlines()[0])
    p.add_argument("--kind", choices=["sync", "async", "task", "task-async"], required=True)
    p.add_argument("--prefetch", type=int, default=0, help="the sync Worker's prefetch (0: off, the default)")
    a = p.parse_args()
    try:
        if a.kind == "task":
            run_tasks(a.url, a.n, a.queue, a.concurrency, a.timeout)
        elif a.kind == "task-async":
            asyncio.run(run_async_tasks(a.url, a.n, a.queue, a.concurrency, a.timeout))
        elif a.kind == "sync":
            run_sync(a.url, a.n, a.queue, a.concurrency, a.timeout, a.prefetch, a.enqueue, a.until_stop)
        else:
            asyncio.run(run_async(a.url, a.n, a.queue, a.concurrency, a.timeout, a.enqueue, a.until_stop))
    except Exception as exc:
        emit("error", message=f"{type(exc).__name__}: {exc}")
        raise


if __name__ == "__main__":
    main()
