"""saq contender: one Worker with concurrency 10, otherwise saq's defaults.

Runs in bench/.venv-peers.  See protocol.py for the conversation with the harness.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from typing import Any

from protocol import Clock, emit, expect, parser, verdict
from saq import Queue, Worker


async def noop(ctx: dict[str, Any]) -> None:
    return None


async def run(a: Any) -> None:
    queue = Queue.from_url(a.url, name=a.queue)
    await queue.connect()
    keys = [f"j{i}" for i in range(a.n)]
    t = time.perf_counter()
    for k in range(0, a.n, 100):  # saq enqueues one job per call; 100 calls in flight at a time
        await asyncio.gather(*(queue.enqueue("noop", key=key) for key in keys[k : k + 100]))
    emit("ready", enqueued=await queue.count("queued"), enqueue_s=time.perf_counter() - t)
    expect("go")
    clock = Clock()
    done = asyncio.Event()
    finished = 0

    async def after_process(ctx: dict[str, Any]) -> None:  # runs once the job has been finished
        nonlocal finished
        finished += 1
        if finished >= a.n:
            done.set()

    worker_queue = Queue.from_url(a.url, name=a.queue)
    worker = Worker(worker_queue, functions=[noop], concurrency=a.concurrency, after_process=after_process)
    task = asyncio.create_task(worker.start())
    with contextlib.suppress(asyncio.TimeoutError):
        await asyncio.wait_for(done.wait(), a.timeout)
    emit("drained", elapsed_s=clock.elapsed(), processed=finished, timed_out=finished < a.n)
    expect("verify")  # blocking: the worker waits until the harness has read INFO
    await worker.stop()
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task
    statuses: list[str | None] = []
    errors: list[str] = []
    for k in range(0, a.n, 500):
        for j in await queue.jobs(keys[k : k + 500]):
            statuses.append(None if j is None else j.status.value)
            if j is not None and j.status.value != "complete" and len(errors) < 3:
                errors.append(f"{j.key}: {j.status.value}: {(j.error or '').strip()[-300:]}")
    emit("verified", **verdict(statuses, "complete", ("failed", "aborted")), errors=errors)
    await queue.disconnect()


def main() -> None:
    a = parser(__doc__.splitlines()[0]).parse_args()
    try:
        asyncio.run(run(a))
    except Exception as exc:
        emit("error", message=f"{type(exc).__name__}: {exc}")
        raise


if __name__ == "__main__":
    main()
