"""The deadline watch: one thread that loses each watched lease when its deadline passes
(and tells a handler past its timeout, ``_runtime.timeouts``).

Both keepers need it.  A thread keeper's checkpoint may be stuck on a dead
connection; an asyncio keeper's event loop may be blocked by a handler that
never awaits.  Neither must keep a handler running, unaware, past its lease:
this thread cancels the handler's token at the deadline whatever the keeper
or the loop is doing (a handler that checks its token between blocking steps
stops at its next check), and the worker sees the loss when it decides what
to send.

The thread exists only while something is watched or retained: a worker
retains it for the whole of its run (no thread per job), a lone keeper for
its own life.  Each watched job comes with the lock its keeper updates it
under and the keeper's clock; a clock other than ``time.monotonic`` (tests)
is looked at every ``FAKE_CLOCK_POLL_S``, so whatever it does, a deadline
it reaches is noticed.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import Any

from ._runtime import HeldJob

__all__ = ["WATCH", "DeadlineWatch"]

FAKE_CLOCK_POLL_S = 0.05
log = logging.getLogger("echomq.lease")
# The thread sleeps at most this long, even with nothing watched: a job added
# with a later deadline (a lease of more than this) need not wake it.  A busy
# worker adds a job and removes it a moment later, and a wake per job costs
# its threads the GIL.
HORIZON_S = 5.0


_Lock = AbstractContextManager[Any]


class DeadlineWatch:
    """Watches the deadlines of held jobs from one background thread (see the module docstring)."""

    def __init__(self) -> None:
        # Its sections take the lock itself (C), not the Condition's Python __enter__/__exit__.
        self._mutex = threading.RLock()
        self._cond = threading.Condition(self._mutex)
        self._watched: dict[int, tuple[HeldJob, _Lock, Callable[[], float]]] = {}
        self._retained = 0
        # While the thread sleeps: when it wakes next (time.monotonic; inf: only when notified).
        # While it is awake: -inf, and additions are seen through _changes instead.
        self._wakes_at = -math.inf
        self._changes = 0
        self._thread: threading.Thread | None = None  # the live one (None once it decided to end)
        self._last: threading.Thread | None = None  # the latest started, to join when idle

    def add(self, held: HeldJob, lock: _Lock, clock: Callable[[], float] = time.monotonic) -> None:
        """Watch ``held``'s deadline; ``lock`` is what its keeper holds while it updates ``held``."""
        with self._mutex:
            self._watched[id(held)] = (held, lock, clock)
            if self._thread is None or not self._retained:  # a retained thread never ends (_run)
                self._ensure_thread()
            # Wake the thread only if it would otherwise sleep past this deadline:
            # a busy worker adds and removes jobs all the time.
            self._changes += 1
            if clock is not time.monotonic or held.next_deadline() < self._wakes_at:
                self._cond.notify()

    def earlier(self, when: float) -> None:
        """A watched job's next deadline is now ``when`` (a handler's timeout): look by then."""
        with self._mutex:
            self._changes += 1
            if when < self._wakes_at:
                self._cond.notify()

    def remove(self, held: HeldJob) -> None:
        """Stop watching ``held``; the thread ends (and is joined) when nothing is left to watch."""
        with self._mutex:
            self._watched.pop(id(held), None)
            idle = self._idle()
            if idle:
                self._cond.notify()
        if idle:
            self._join_if_idle()

    def retain(self) -> None:
        """Keep the thread for a worker's whole run, instead of one per job."""
        with self._mutex:
            self._retained += 1
            self._ensure_thread()

    def release(self) -> None:
        with self._mutex:
            self._retained = max(0, self._retained - 1)
            self._cond.notify()
        self._join_if_idle()

    @property
    def running(self) -> bool:
        thread = self._thread
        return thread is not None and thread.is_alive()

    def _ensure_thread(self) -> None:
        if self._thread is None or not self._thread.is_alive():
            self._thread = self._last = threading.Thread(
                target=self._run, name="echomq-deadline-watch", daemon=True
            )
            self._thread.start()

    def _idle(self) -> bool:
        return not self._watched and self._retained == 0

    def _join_if_idle(self) -> None:
        # Nothing left: wait the few microseconds the thread takes to see it,
        # so whoever stopped the last keeper leaves no thread behind.
        with self._mutex:
            thread = self._last if self._idle() else None
        if thread is not None and thread is not threading.current_thread():
            thread.join()

    def _run(self) -> None:
        while True:
            with self._mutex:
                if self._idle():
                    if self._thread is threading.current_thread():
                        self._thread = None
                    return
                entries = list(self._watched.values())
                seen = self._changes
            try:
                wait = self._expire(entries)
            except Exception:  # a bug: never leave deadlines unwatched; look again soon
                log.exception("the deadline watch failed; it goes on")
                wait = FAKE_CLOCK_POLL_S
            wait = HORIZON_S if wait is None else min(wait, HORIZON_S)
            with self._mutex:
                if self._changes != seen or self._idle():
                    continue  # added while we looked: look again before sleeping
                self._wakes_at = time.monotonic() + wait
                self._cond.wait(wait)
                self._wakes_at = -math.inf

    @staticmethod
    def _expire(entries: list[tuple[HeldJob, _Lock, Callable[[], float]]]) -> float | None:
        """Lose the leases past their deadline; returns how long until the next one could pass."""
        wait: float | None = None
        for held, lock, clock in entries:
            with lock:
                if held.lost is not None or held.given_back:
                    continue
                now = clock()
                held.expire(now)
                if held.lost is not None:
                    continue
                held.time_out(now)  # a handler past its timeout: "timeout" to its token
                left = max(held.next_deadline() - now, 0.0)
            if clock is not time.monotonic:
                left = min(left, FAKE_CLOCK_POLL_S)
            wait = left if wait is None else min(wait, left)
        return wait


# One per process: a worker with a thousand jobs in flight has one watch thread.
WATCH = DeadlineWatch()
