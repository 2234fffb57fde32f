"""The FastAPI app of docs/guides/fastapi.md, with knobs for tests/integrations/test_fastapi.py.

The same shape as the guide's ``create_api`` (whose own block runs in
tests/house/test_examples.py): the asyncio client and an ``echomq.asyncio.App``,
its worker started and stopped by the app's lifespan.  ``grace`` is the
worker's shutdown grace; ``GET /slow`` enqueues a task that sleeps
``seconds`` and records its end in ``ended``.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import FastAPI, HTTPException

import echomq
import echomq.asyncio

QUEUE = "fastapi-reports"


def create_api(url: str, *, grace: float = 10.0) -> tuple[FastAPI, list[str]]:
    client = echomq.asyncio.Client.from_url(url)
    tasks = echomq.asyncio.App(client, queue=QUEUE)
    ended: list[str] = []  # what the tasks and the lifespan did, in order

    @tasks.task(max_attempts=3)
    async def add(a: int, b: int) -> int:
        await asyncio.sleep(0.05)
        return a + b

    @tasks.task
    async def slow(seconds: float) -> str:
        await asyncio.sleep(seconds)
        ended.append("slow")
        return "slept"

    @asynccontextmanager
    async def lifespan(api: FastAPI) -> AsyncIterator[None]:
        worker = tasks.worker(concurrency=4, poll_interval=0.05)
        running = asyncio.create_task(worker.run(handle_signals=False))
        api.state.worker = worker
        try:
            yield
        finally:
            worker.stop(grace=grace)
            await running
            await client.aclose()
            ended.append("lifespan")

    api = FastAPI(lifespan=lifespan)

    @api.post("/sums", status_code=202)
    async def enqueue_sum(a: int, b: int) -> dict[str, str]:
        handle = await add.enqueue(a, b)
        return {"id": handle.id}

    @api.post("/slow", status_code=202)
    async def enqueue_slow(seconds: float) -> dict[str, str]:
        handle = await slow.enqueue(seconds)
        return {"id": handle.id}

    @api.get("/sums/{job_id}")
    async def sum_result(job_id: str, wait: float = 10.0) -> dict[str, int]:
        try:
            value: int = await tasks.handle(QUEUE, job_id).result(timeout=wait)
        except echomq.ResultTimeout:
            raise HTTPException(202, "not done yet") from None
        except echomq.JobGone:
            raise HTTPException(404, "no such job (or its result has expired)") from None
        except echomq.JobFailed as exc:
            raise HTTPException(500, f"{exc.type}: {exc.message}") from None
        return {"sum": value}

    return api, ended
