"""The reaper (threads): run EMQ.SWEEP on an interval, in a background thread.

Safe to run on many hosts at once: each sweep is one atomic command, so two
reapers never recover the same job twice.  The tick's rule (a full batch:
sweep again, bounded) and the counts are ``_runtime``'s.

Hand-written beside its twin ``asyncio/reaper.py``, not generated from it
(``tests/unasync.py``): a background thread with ``start``/``stop``/``with`` where asyncio
has one task and ``async with``; the sync reaper carries the docs.
"""

from __future__ import annotations

import threading
from types import TracebackType

from .._runtime import ReaperCore
from ._schedules import drive_quietly
from .client import Client, SweepResult

__all__ = ["Reaper"]


class Reaper(ReaperCore[Client]):
    """Recover lapsed jobs of ``queue`` every ``interval`` seconds.

    ``Reaper(client, queue, *, interval=1.0, max_stalled=1, limit=100,
    on_sweep=None)``: each tick sweeps up to ``limit`` jobs at a time until
    a sweep comes back short (at most 100 sweeps a tick), then calls
    ``on_sweep(result)`` if it did anything.  ``recovered``, ``dead``,
    ``cancelled`` and ``errors`` (failed ticks) count since creation; a
    failed tick is logged once per outage (or per kind of refusal), not
    with a traceback every tick.  Every argument is checked here.

    >>> with Reaper(client, "mail", interval=1.0, max_stalled=3):  # doctest: +SKIP
    ...     run_forever()
    """

    _client_type = Client

    def _init_driver(self) -> None:
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def sweep_once(self) -> SweepResult:
        """Sweep until nothing lapsed is left (bounded); returns everything it did."""
        drive_quietly(self.client, self.queue, self._troubles.report)  # the queue's due schedule ticks
        tick = self._tick()
        while tick.wants_more():
            tick.add(self.client.sweep(self.queue, max_stalled=self.max_stalled, limit=self.limit))
        return self._swept(tick)

    def run(self) -> None:
        """Sweep every ``interval`` until ``stop()``; errors are counted, logged once, and retried."""
        while True:
            try:
                self.sweep_once()
            except Exception as exc:
                self._sweep_failed(exc)
            if self._stop.wait(self.interval):
                return

    def start(self) -> Reaper:
        """Run in a background thread; returns at once."""
        self._stop.clear()
        self._thread = threading.Thread(target=self.run, name=f"echomq-reaper-{self.queue}", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop, and wait for a sweep in flight to end (not when called from ``on_sweep`` itself)."""
        self._stop.set()
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join()
            self._thread = None

    def __enter__(self) -> Reaper:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()
