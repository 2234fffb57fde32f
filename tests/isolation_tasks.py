"""An app for tests/workers/test_isolation.py's tasks in child processes: importable, as the children need.

The children import ``tests.isolation_tasks:app`` (or ``:aio_app``, found in
this module's globals) and never use its client: the tests point ``app.client`` at their
server before they make a worker.  Tasks that leave traces write them to the
file they are given, one line per call: ``<what> <pid>``.
"""

from __future__ import annotations

import asyncio
import os
import time
from pathlib import Path

import echomq
import echomq.asyncio as emq

Q = "iso-tasks"
app = echomq.App(echomq.Client.from_url("redis://127.0.0.1:1"), queue=Q)
AQ = "iso-aio"
aio_app = emq.App(emq.Client.from_url("redis://127.0.0.1:1"), queue=AQ)


def note(path: str, what: str) -> None:
    with Path(path).open("a") as out:
        out.write(f"{what} {os.getpid()}\n")


@app.task
def add(a: int, b: int) -> dict[str, int]:
    return {"sum": a + b, "pid": os.getpid()}


@app.task
def fails(row: int) -> None:
    raise ValueError(f"bad row {row}")


@app.task
def refuses() -> None:
    raise echomq.NonRetryable("no retry can help")


@app.task(max_attempts=2)
def later(path: str) -> str:
    """First try: RetryLater (its delay must cross the pipe); the second returns."""
    note(path, f"tried {time.time()}")
    if len(Path(path).read_text().splitlines()) == 1:
        raise echomq.RetryLater("busy", delay_ms=200)
    return "done"


@app.task
def throttled(path: str) -> str:
    """First run: the downstream said 429 (RateLimited: given back, no try used); the next returns."""
    note(path, "ran")
    if len(Path(path).read_text().splitlines()) == 1:
        echomq.task_context().rate_limited(100)
    return "done"


@app.task
def reports(path: str) -> int:
    """Progress and a checkpoint from the child, stored by the worker; the job's own ctx seen there."""
    ctx = echomq.task_context()
    ctx.progress({"done": 3, "of": 4})
    ctx.checkpoint_step(3, {"rows": 30})
    note(path, f"reported {ctx.id}")
    return os.getpid()


def stubborn_body(path: str) -> None:
    """Ignores its token and never checkpoints: a C call that does not return, for Python."""
    note(path, "started")
    for _ in range(30):  # 1.5 s of time.sleep, which no cancel interrupts
        time.sleep(0.05)
    note(path, "after")  # the side effect a hard stop must prevent


@app.task
def stubborn(path: str) -> None:
    stubborn_body(path)


@app.task(isolation="process", timeout_ms=300, max_attempts=1)
def stubborn_alone(path: str) -> None:
    """Asks for a process of its own, whatever the worker runs: its timeout is a kill."""
    stubborn_body(path)


@app.task(isolation="process", max_jobs_per_child=2)
def whose() -> int:
    return os.getpid()


@app.task
def here() -> int:
    return os.getpid()


@app.task
def until_cancelled(path: str) -> None:
    note(path, "started")
    ctx = echomq.task_context()
    while True:
        ctx.cancel.sleep(0.05)
        ctx.checkpoint()


# -- an asyncio app's tasks that ask for a process ---------------------------------------------


@aio_app.task(isolation="process", timeout_ms=300, max_attempts=1)
async def stubborn_async(path: str) -> None:
    """Blocks its own loop (no await, no checkpoint): only a kill stops it."""
    stubborn_body(path)


@aio_app.task(isolation="process")
async def reports_async(path: str) -> int:
    ctx = emq.task_context()  # an asyncio context in the child too: its calls awaited
    await ctx.progress({"done": 1})
    await ctx.checkpoint_step(1, {"rows": 10})
    note(path, f"reported {ctx.id}")
    return os.getpid()


@aio_app.task
async def here_async() -> int:
    return os.getpid()


# -- an asyncio app whose worker runs every task in child processes (app.worker(isolation="process")) --

WQ = "iso-aio-whole"
aio_whole = emq.App(emq.Client.from_url("redis://127.0.0.1:1"), queue=WQ)


@aio_whole.task
async def add_whole(a: int, b: int) -> dict[str, int]:
    return {"sum": a + b, "pid": os.getpid()}


@aio_whole.task
async def fails_whole(row: int) -> None:
    raise ValueError(f"bad row {row}")


@aio_whole.task
async def refuses_whole() -> None:
    raise echomq.NonRetryable("no retry can help")


@aio_whole.task(max_attempts=2)
async def later_whole(path: str) -> str:
    note(path, f"tried {time.time()}")
    if len(Path(path).read_text().splitlines()) == 1:
        raise echomq.RetryLater("busy", delay_ms=200)
    return "done"


@aio_whole.task
async def reports_whole(path: str) -> int:
    ctx = emq.task_context()
    await ctx.progress({"done": 2, "of": 4})
    await ctx.checkpoint_step(2, {"rows": 20})
    note(path, f"reported {ctx.id}")
    return os.getpid()


@aio_whole.task
async def until_cancelled_whole(path: str) -> None:
    note(path, "started")
    ctx = emq.task_context()
    while True:
        await asyncio.sleep(0.05)
        await ctx.checkpoint()


@aio_whole.task(timeout_ms=300, max_attempts=1)
async def stubborn_whole(path: str) -> None:
    """Blocks the child's loop (no await, no checkpoint): only a kill stops it."""
    stubborn_body(path)


@aio_whole.task
def plain_whole() -> int:
    """A plain function of an asyncio app: in the child it runs in a thread of the child's loop."""
    return os.getpid()


@aio_whole.task
async def meet_whole(path: str, n: int) -> int:
    """Says it is here, then waits (up to 5 s) until ``n`` jobs are: how many it saw."""
    note(path, "here")
    deadline = time.monotonic() + 5
    while len(Path(path).read_text().splitlines()) < n and time.monotonic() < deadline:
        time.sleep(0.02)
    return len(Path(path).read_text().splitlines())
