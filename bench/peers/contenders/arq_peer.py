"""arq contender: one Worker, max_jobs = concurrency, otherwise arq's defaults (poll_delay 0.5 s).

Runs in bench/.venv-peers.  See protocol.py for the conversation with the harness.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from typing import Any

from arq import Worker, create_pool
from arq.connections import RedisSettings
from arq.jobs import Job
from protocol import Clock, emit, expect, parser, verdict


async def noop(ctx: dict[str, Any]) -> None:
    return None


async def job_status(redis: Any, job_id: str) -> str | None:
    job = Job(job_id, redis)
    info = await job.result_info()
    if info is not None:
        return "success" if info.success else "failed"
    status = (await job.status()).value
    return None if status == "not_found" else status


async def run(a: Any) -> None:
    settings = RedisSettings.from_dsn(a.url)
    pool = await create_pool(settings)
    ids = [f"j{i}" for i in range(a.n)]
    t = time.perf_counter()
    for k in range(0, a.n, 100):  # arq enqueues one job per call; 100 calls in flight at a time
        await asyncio.gather(*(pool.enqueue_job("noop", _job_id=job_id) for job_id in ids[k : k + 100]))
    emit("ready", enqueued=await pool.zcard("arq:queue"), enqueue_s=time.perf_counter() - t)
    expect("go")
    clock = Clock()
    done = asyncio.Event()
    finished = 0

    async def after_job_end(ctx: dict[str, Any]) -> None:  # runs once the job's result is stored
        nonlocal finished
        finished += 1
        if finished >= a.n:
            done.set()

    worker = Worker(
        functions=[noop],
        redis_settings=settings,
        max_jobs=a.concurrency,
        handle_signals=False,
        after_job_end=after_job_end,
    )
    task = asyncio.create_task(worker.main())
    with contextlib.suppress(asyncio.TimeoutError):
        await asyncio.wait_for(done.wait(), a.timeout)
    emit("drained", elapsed_s=clock.elapsed(), processed=finished, timed_out=finished < a.n)
    expect("verify")  # blocking: the worker waits until the harness has read INFO
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task
    await worker.close()
    statuses: list[str | None] = []
    for k in range(0, a.n, 200):
        statuses += await asyncio.gather(*(job_status(pool, job_id) for job_id in ids[k : k + 200]))
    out = verdict(statuses, "success", ("failed",))
    out["worker"] = {
        "complete": worker.jobs_complete,
        "failed": worker.jobs_failed,
        "retried": worker.jobs_retried,
    }
    emit("verified", **out)
    await pool.aclose()


def main() -> None:
    a = parser(__doc__.splitlines()[0]).parse_args()
    try:
        asyncio.run(run(a))
    except Exception as exc:
        emit("error", message=f"{type(exc).__name__}: {exc}")
        raise


if __name__ == "__main__":
    main()
