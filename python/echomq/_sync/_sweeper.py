"""A thread worker's own sweep (``reap=True``): the lapsed jobs of its queue recovered without a Reaper.

A worker killed with ``kill -9`` leaves its jobs active until their leases
lapse; then any sweep recovers them.  With ``reap=True`` (the default) every
worker runs one thread that sweeps its queue every ``reap_interval`` seconds
(jittered: ``_runtime.ReapSchedule``), a few small EMQ.SWEEPs a turn
(``_runtime.Reaping``), on the worker's own connections, each try bounded
and cut by the stop.  A separate ``Reaper`` stays optional (a bigger batch,
its own interval, ``on_sweep``).

Hand-written beside its twin ``asyncio/_sweeper.py``, not generated from it
(``tests/unasync.py``): a thread with its stop ``Event`` where asyncio has one task,
cancelled.
"""

from __future__ import annotations

import threading
import time
from typing import Any

from .._runtime import REAP_TIMEOUT_S, ReapSchedule, WorkerCore
from ._attempt import Cutter
from .client import Client

__all__ = ["Sweeper"]


class Sweeper:
    """One thread that runs a worker's sweeps until ``stop()``."""

    def __init__(self, worker: WorkerCore[Client, Any], lock: threading.Lock) -> None:
        self.worker, self._lock = worker, lock
        self._done = threading.Event()
        self._cutter = Cutter()  # stop() cuts the sweep in flight; none starts after it
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        self._thread = threading.Thread(
            target=self._run, name=f"echomq-worker-{self.worker.queue}-sweep", daemon=True
        )
        self._thread.start()

    def cut(self) -> None:
        """No sweep from now on; the one in flight is cut (from any thread, never waits)."""
        self._done.set()
        self._cutter.cut()

    def stop(self) -> None:
        """``cut()``, and wait (bounded) for the thread."""
        self.cut()
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(REAP_TIMEOUT_S)

    def _run(self) -> None:
        schedule = ReapSchedule(self.worker.reap_interval, time.monotonic())
        while not self._done.wait(schedule.wait(time.monotonic())):
            try:
                self.turn()
            except Exception as exc:  # a bug of ours: logged once with its traceback; the next turn comes
                self.worker._trouble(exc, "sweep")
            schedule.swept(time.monotonic())

    def turn(self) -> None:
        """One turn: a sweep, again while one takes a full batch (bounded); a failed one ends the turn."""
        worker = self.worker
        tick = worker._reap_tick()
        while tick.wants_more() and not self._done.is_set():
            try:
                result = worker.client._attempt(worker._reap_call(), REAP_TIMEOUT_S, self._cutter)
            except Exception as exc:
                if not self._done.is_set():  # not the stop's cut
                    worker._trouble(exc, "sweep")
                break
            worker._healed()
            tick.add(result)
        with self._lock:
            worker._reaped(tick)
