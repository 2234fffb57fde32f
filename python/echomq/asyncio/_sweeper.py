"""An asyncio worker's own sweep (``reap=True``): see ``echomq._sweeper``; here, one task.

Hand-written beside its twin ``_sync/_sweeper.py``, not generated from it
(``tests/unasync.py``): a thread with its stop ``Event`` where asyncio has one task,
cancelled.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

from .._runtime import REAP_TIMEOUT_S, ReapSchedule, WorkerCore
from ._waits import wait_event
from .client import Client

__all__ = ["sweep_loop"]


async def sweep_loop(worker: WorkerCore[Client, Any], stopping: asyncio.Event) -> None:
    """Sweep ``worker``'s queue every ``reap_interval`` (jittered) until ``stopping`` is set.

    The worker cancels this task at its stop, a sweep in flight with it
    (its answer lost: what it took is taken, the next sweep takes the rest).
    """
    schedule = ReapSchedule(worker.reap_interval, time.monotonic())
    while not await wait_event(stopping, schedule.wait(time.monotonic())):
        tick = worker._reap_tick()
        while tick.wants_more():
            try:
                result = await worker.client._attempt(worker._reap_call(), REAP_TIMEOUT_S)
            except Exception as exc:
                worker._trouble(exc, "sweep")
                break
            worker._healed()
            tick.add(result)
        worker._reaped(tick)
        schedule.swept(time.monotonic())
