"""Handlers for tests/workers/test_isolation.py: importable by name, as isolation="process" needs.

Each writes what the test must see (its process id, what its context
showed) to the file named by the job's payload, one line per call.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import echomq
import echomq.asyncio


def note(ctx: echomq.JobContext, line: str) -> None:
    with Path(ctx.payload.decode()).open("a") as out:
        out.write(f"{ctx.id} {os.getpid()} {line}\n")


def quick(ctx: echomq.JobContext) -> None:
    note(ctx, "ran")


def deaf(ctx: echomq.JobContext) -> None:
    """Ignores its token: only a kill stops it."""
    note(ctx, "started")
    while True:
        time.sleep(0.05)


def deaf_once(ctx: echomq.JobContext) -> None:
    """Job "deaf" ignores its token; every other job runs at once."""
    if ctx.id == "deaf":
        deaf(ctx)
    note(ctx, "ran")


def crash(ctx: echomq.JobContext) -> None:
    note(ctx, "crashing")
    os._exit(3)


def crash_leaving_a_grandchild(ctx: echomq.JobContext) -> None:
    """The child exits; a process it forked lives on with every descriptor it had (the pipe too)."""
    if os.fork() == 0:  # the grandchild: holds the worker's pipe open for 30 s, then goes
        time.sleep(30)
        os._exit(0)
    note(ctx, "crashing")
    os._exit(4)


def fails(ctx: echomq.JobContext) -> None:
    raise ValueError(f"bad row in {ctx.id}")


class Unpicklable(Exception):
    def __init__(self, code: int, detail: str) -> None:
        super().__init__(f"code {code}")  # args do not match __init__: pickles, will not unpickle
        self.detail = detail


def fails_oddly(ctx: echomq.JobContext) -> None:
    raise Unpicklable(7, "x")


def resumes(ctx: echomq.JobContext) -> None:
    """First attempt: stores a state through the worker, then fails; the next sees it."""
    note(ctx, f"resume={ctx.resume_state!r}")
    if ctx.resume_state is None:
        ctx.checkpoint(b"half-way")
        raise RuntimeError("first attempt fails after its checkpoint")


def until_cancelled(ctx: echomq.JobContext) -> None:
    note(ctx, "started")
    while True:
        ctx.cancel.sleep(0.05)
        ctx.raise_if_cancelled()


def big_state(ctx: echomq.JobContext) -> None:
    try:
        ctx.checkpoint(b"x" * (70 * 1024))  # over the default emq.max-state-bytes (64 KiB)
    except ValueError as exc:
        note(ctx, f"refused {type(exc).__name__}")


async def deaf_once_async(ctx: echomq.asyncio.JobContext) -> None:
    """An asyncio handler: job "deaf" blocks its loop (no await): only a kill stops it."""
    if ctx.id == "deaf":
        deaf(ctx)  # type: ignore[arg-type]
    await ctx.checkpoint(b"seen")
    note(ctx, "ran")  # type: ignore[arg-type]
