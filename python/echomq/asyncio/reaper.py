"""The reaper for asyncio: EMQ.SWEEP on an interval, in a task (see ``echomq.reaper``).

Hand-written beside its twin ``_sync/reaper.py``, not generated from it
(``tests/unasync.py``): a background thread with ``start``/``stop``/``with`` where asyncio
has one task and ``async with``; the sync reaper carries the docs.
"""

from __future__ import annotations

import asyncio
from types import TracebackType

from .._protocol import SweepResult
from .._runtime import ReaperCore
from ._schedules import drive_quietly
from ._waits import wait_event
from .client import Client

__all__ = ["Reaper"]


class Reaper(ReaperCore[Client]):
    """Sweep ``queue`` every ``interval`` seconds in a task.

    The same arguments, attributes and tick as ``echomq.Reaper``
    (``on_sweep`` is a plain function, called in the loop).
    """

    _client_type = Client

    def _init_driver(self) -> None:
        self._stop = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    async def sweep_once(self) -> SweepResult:
        """Sweep until nothing lapsed is left (bounded); returns everything it did."""
        await drive_quietly(self.client, self.queue, self._troubles.report)  # the queue's due schedule ticks
        tick = self._tick()
        while tick.wants_more():
            tick.add(await self.client.sweep(self.queue, max_stalled=self.max_stalled, limit=self.limit))
        return self._swept(tick)

    async def run(self) -> None:
        """Sweep every ``interval`` until ``stop()``; errors are counted, logged once, and retried."""
        while True:
            try:
                await self.sweep_once()
            except Exception as exc:
                self._sweep_failed(exc)
            if await wait_event(self._stop, self.interval):
                return

    def start(self) -> Reaper:
        """Run in a task of the running loop; returns at once."""
        self._stop.clear()
        self._task = asyncio.create_task(self.run(), name=f"echomq-reaper-{self.queue}")
        return self

    async def stop(self) -> None:
        """Stop, and wait for a sweep in flight to end."""
        self._stop.set()
        if self._task is not None:
            await self._task
            self._task = None

    async def __aenter__(self) -> Reaper:
        return self.start()

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.stop()
