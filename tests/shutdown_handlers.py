"""Handlers for the shutdown tests' worker processes (``echomq worker tests.shutdown_handlers:NAME``).

- ``cooperative``: runs until its job is cancelled (it checks its token), then stops at that safe point.
- ``quick``: 0.3 s of work, then returns.
- ``stubborn``: 30 s of work that never looks at its token.
The ``a``-prefixed ones are the same as coroutines (the CLI then runs the asyncio worker).
"""

from __future__ import annotations

import asyncio
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
