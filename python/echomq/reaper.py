"""The reaper: run EMQ.SWEEP on an interval, in a background thread.

Safe to run on many hosts at once: each sweep is one atomic command, so two
reapers never recover the same job twice.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from types import TracebackType

from .client import Client, SweepResult

__all__ = ["Reaper"]

log = logging.getLogger("echomq.reaper")

# A sweep that took `limit` jobs may have left more behind; keep sweeping,
# but never spin forever on one tick.
_MAX_SWEEPS_PER_TICK = 100


class Reaper:
    """Recover lapsed jobs of ``queue`` every ``interval`` seconds.

    >>> with Reaper(client, "mail", interval=1.0, max_stalled=3):  # doctest: +SKIP
    ...     run_forever()
    """

    def __init__(
        self,
        client: Client,
        queue: str,
        *,
        interval: float = 1.0,
        max_stalled: int = 1,
        limit: int = 100,
        on_sweep: Callable[[SweepResult], None] | None = None,
    ) -> None:
        if interval <= 0:
            raise ValueError("interval must be > 0")
        self.client, self.queue = client, queue
        self.interval, self.max_stalled, self.limit = interval, max_stalled, limit
        self.on_sweep = on_sweep
        self.recovered = 0
        self.dead = 0
        self.errors = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def sweep_once(self) -> SweepResult:
        """Sweep until nothing lapsed is left (bounded); returns everything it did."""
        recovered: list[str] = []
        dead: list[str] = []
        for _ in range(_MAX_SWEEPS_PER_TICK):
            result = self.client.sweep(self.queue, max_stalled=self.max_stalled, limit=self.limit)
            recovered += result.recovered
            dead += result.dead
            if len(result) < self.limit:
                break
        total = SweepResult(recovered, dead)
        self.recovered += len(recovered)
        self.dead += len(dead)
        if total and self.on_sweep is not None:
            self.on_sweep(total)
        return total

    def run(self) -> None:
        """Sweep every ``interval`` until ``stop()``; errors are logged and retried."""
        while True:
            try:
                self.sweep_once()
            except Exception:
                self.errors += 1
                log.exception("sweep of %s failed", self.queue)
            if self._stop.wait(self.interval):
                return

    def start(self) -> Reaper:
        self._stop.clear()
        self._thread = threading.Thread(target=self.run, name=f"echomq-reaper-{self.queue}", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
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
