"""Handlers for the shutdown tests' worker processes (``echomq worker tests.shutdown_handlers:NAME``).

- ``cooperative``: runs until its job is cancelled (it checks its token), then stops at that safe point.
- ``quick``: 0.3 s of work, then returns.
- ``stubborn``: 30 s of work that never looks at its token.
- ``aflagged`` (asyncio only): makes a file named after its job in the directory $STARTED, then
  works until the file $FLAG exists, and returns (every one in the same loop turn: their ends
  go out in one batch).
The ``a``-prefixed ones are the same as coroutines (the CLI then runs the asyncio worker).
"""

from __future__ import annotations

import asyncio
import os
import time

import echomq
import echomq.asyncio as emq


def cooperative(ctx: echomq.JobContext) -> None:
    while not ctx.cancel.sleep(0.05):
        pass
    ctx.raise_if_cancelled()


def quick(ctx: echomq.JobContext) -> None:
    time.sleep(0.3)


def stubborn(ctx: echomq.JobContext) -> None:
    time.sleep(30)


async def acooperative(ctx: emq.JobContext) -> None:
    await ctx.cancel.wait()
    ctx.raise_if_cancelled()


async def aquick(ctx: emq.JobContext) -> None:
    await asyncio.sleep(0.3)


async def astubborn(ctx: emq.JobContext) -> None:
    await asyncio.sleep(30)


async def astubborn_seen(ctx: emq.JobContext) -> None:
    """``astubborn`` that says it started (its progress): a test signals only once every handler runs."""
    await ctx.progress("started")
    await asyncio.sleep(30)


_FLAG: list[asyncio.Event] = []  # one for the process: every aflagged handler returns in the same loop turn


async def _watch_flag(flag: asyncio.Event) -> None:
    while not os.path.exists(os.environ["FLAG"]):
        await asyncio.sleep(0.01)
    flag.set()


async def aflagged(ctx: emq.JobContext) -> None:
    with open(os.path.join(os.environ["STARTED"], ctx.job.id), "w"):  # the test sees it running
        pass
    if not _FLAG:
        _FLAG.append(asyncio.Event())
        _TASKS.append(asyncio.create_task(_watch_flag(_FLAG[0])))
    await _FLAG[0].wait()


_TASKS: list[asyncio.Task[None]] = []
