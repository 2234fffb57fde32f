"""The reaper (threads): run EMQ.SWEEP on an interval, in a background thread.

Safe to run on many hosts at once: each sweep is one atomic command, so two
reapers never recover the same job twice.  The tick's rule (a full batch:
sweep again, bounded) and the counts are ``_runtime``'s.
"""

from __future__ import annotations

import threading
from types import TracebackType

from ._runtime import ReaperCore
from .client import Client, SweepResult

__all__ = ["Reaper"]


class Reaper(ReaperCore[Client]):
    """Recover lapsed jobs of ``queue`` every ``interval`` seconds.

    ``Reaper(client, queue, *, interval=1.0, max_stalled=1, limit=100,
    on_sweep=None)``: each tick sweeps up to ``limit`` jobs at a time until
    a sweep comes back short (at most 100 sweeps a tick), then calls
    ``on_sweep(result)`` if it recovered or dead-lettered anything.
    ``recovered``, ``dead`` and ``errors`` count since creation.

    >>> with Reaper(client, "mail", interval=1.0, max_stalled=3):  # doctest: +SKIP
    ...     run_forever()
    """

    def _init_driver(self) -> None:
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def sweep_once(self) -> SweepResult:
        """Sweep until nothing lapsed is left (bounded); returns everything it did."""
        tick = self._tick()
        while tick.wants_more():
            tick.add(self.client.sweep(self.queue, max_stalled=self.max_stalled, limit=self.limit))
        return self._swept(tick)

    def run(self) -> None:
        """Sweep every ``interval`` until ``stop()``; errors are logged and retried."""
        while True:
            try:
                self.sweep_once()
            except Exception:
                self._sweep_failed()
            if self._stop.wait(self.interval):
                return

    def start(self) -> Reaper:
        """Run in a background thread; returns at once."""
        self._stop.clear()
        self._thread = threading.Thread(target=self.run, name=f"echomq-reaper-{self.queue}", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop, and wait for a sweep in flight to end."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None

    def __enter__(self) -> Reaper:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()
