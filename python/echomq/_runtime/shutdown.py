"""The shutdown, in both drivers: stop claiming, a grace, "shutdown" to every token, the jobs given back.

``_request_stop`` stops claiming at once (a job whose claim was in flight is
given back without running); at the end of the grace ``_shutdown_tick``
cancels every running handler's token with "shutdown"; ``FORCE_AFTER_S``
later ``_force`` hands the driver the jobs whose handlers still run, to give
back itself.  A handler that ends after "shutdown" by raising has its job
released (no attempt used).  ``Shutdown`` is that part of ``WorkerCore``.
"""

from __future__ import annotations

import math
import signal
import time

from .args import check_seconds
from .lease import HeldJob, Leases
from .logs import worker_log

# The reason a stopping worker gives its running handlers when their grace is over.
SHUTDOWN = "shutdown"

# After the grace and "shutdown" on every token, handlers get this much longer
# to return; then the worker gives their jobs back itself and stops waiting:
# a process exits within grace + 1 s.
FORCE_AFTER_S = 0.5
# After a forced stop, how long the worker's commands still in flight or to
# send (the jobs given back, a claim's answer to settle) may take.  A give-back
# still gets one real try past it (the drivers' SETTLE_TRY_S, in one pipeline
# for all the jobs): against a server that answers, the exit is no later; one
# that does not costs that try.
FORCE_BUDGET_S = 0.4


def forced_exit(signum: int | None) -> BaseException:
    """What ``run()`` raises after a second signal forced it out: what the signal means to Python."""
    if signum is None or signum == signal.SIGINT:
        return KeyboardInterrupt()
    return SystemExit(128 + signum)


class Shutdown:
    """The shutdown's state and steps, for ``WorkerCore`` (see the module docstring)."""

    queue: str
    grace: float
    _held: Leases
    _stop_requested: bool
    _grace_until: float
    _tokens_cancelled: bool
    _forced: bool
    _force_until: float
    _interrupt: BaseException | None

    def _request_stop(self, now: float, grace: float | None = None) -> bool:
        """Stop claiming now; handlers get ``grace`` (default ``self.grace``) seconds.

        A second request can only shorten the grace.  True if this call
        started the shutdown.
        """
        wait = self.grace if grace is None else check_seconds("grace", grace, zero_ok=True)
        self._grace_until = min(self._grace_until, now + wait)
        if self._stop_requested:
            return False
        self._stop_requested = True
        worker_log.info(
            "worker of %r stopping: no new jobs; %d running get %.1f s to finish",
            self.queue,
            len(self._held),
            wait,
        )
        return True

    def _shutdown_tick(self, now: float) -> float | None:
        """Advance a shutdown in progress: at the grace's end, "shutdown" to every token.

        Returns the seconds until the next step (0.0 once it is time to
        ``_force``), or None when no shutdown is in progress.
        """
        if not self._stop_requested:
            return None
        if not self._tokens_cancelled and now >= self._grace_until:
            self._tokens_cancelled = True
            if len(self._held):
                worker_log.info(
                    "worker of %r: grace over, cancelling %d running handlers", self.queue, len(self._held)
                )
            self._held.cancel_all(SHUTDOWN)
        if not self._tokens_cancelled:
            return self._grace_until - now
        return max(0.0, self._grace_until + FORCE_AFTER_S - now)

    def _force(self, now: float | None = None) -> list[HeldJob]:
        """Stop at once: every token cancelled; returns the jobs whose handlers still run.

        The driver gives those back itself (``RELEASE``) and stops waiting
        for their handlers; when one ends later, its job is ``DROP``ped.
        Jobs being finished already are left to their finish, and every
        command still to send gets ``FORCE_BUDGET_S`` (``_bounded``).
        """
        now = time.monotonic() if now is None else now
        self._force_until = min(self._force_until, now + FORCE_BUDGET_S)
        self._stop_requested = self._tokens_cancelled = self._forced = True
        self._held.cancel_all(SHUTDOWN)
        # Lost to its deadline (the server out of reach) is still ours: given back too (``maybe_ours``).
        out = [h for h in self._held if not h.finishing and not h.given_back and h.maybe_ours]
        for h in out:
            h.given_back = True
        if out:
            worker_log.warning(
                "worker of %r: %d handlers did not stop in time; giving their jobs back", self.queue, len(out)
            )
        return out

    def _on_signal(self, signum: int, now: float) -> bool:
        """SIGINT/SIGTERM: the first stops gracefully, the second forces; True when it is time to force."""
        if not self._stop_requested:
            worker_log.warning(
                "worker of %r: %s: stopping (a second signal stops at once)",
                self.queue,
                signal.Signals(signum).name,
            )
            self._request_stop(now)
            return False
        worker_log.warning(
            "worker of %r: %s again: stopping at once", self.queue, signal.Signals(signum).name
        )
        if self._interrupt is None:
            self._interrupt = forced_exit(signum)
        return True

    def _interrupted(self, exc: BaseException, now: float) -> None:
        """A handler raised a BaseException (SystemExit, KeyboardInterrupt...): stop; run() raises it last."""
        if self._interrupt is None:
            self._interrupt = exc
        worker_log.error("worker of %r: a handler raised %s: stopping", self.queue, type(exc).__name__)
        self._request_stop(now)

    def _cut_by_stop(self, until: float | None) -> bool:
        """Whether a forced stop's budget ends a command's tries before ``until`` would (its lease)."""
        return self._force_until < math.inf and (until is None or self._force_until < until)

    def _bounded(self, until: float | None) -> float | None:
        """A command's deadline, and after a forced stop no later than its budget: bounded by stop."""
        if self._force_until == math.inf:
            return until
        return self._force_until if until is None else min(until, self._force_until)
