"""Errors and retries: what an error means (``Trouble``), who hears of it once (``Troubles``),
and when one command is sent again (``Backoff``)."""

from __future__ import annotations

import enum
import logging
import random
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING

from redis import exceptions as rx

from .._protocol import Job
from ..errors import BadArgument, CorruptQueue, EchoMQError, ModuleNotLoaded
from .logs import job_fields
from .tries import NotSent

if TYPE_CHECKING:
    from .stats import WorkerStats


# Retrying one command: waits from 50 ms doubling to 1 s (jittered); each
# attempt's reply awaited 2 s, doubling to 30 s (a slow server still answers
# in time; a half-open connection is given up and the next attempt opens a
# fresh one).
RETRY_FIRST_S = 0.05
RETRY_CAP_S = 1.0
ATTEMPT_TIMEOUT_S = 2.0
ATTEMPT_TIMEOUT_CAP_S = 30.0
# Near its deadline, an attempt waits at most this share of the time left (but
# at least TRY_FLOOR_S): one lost on a half-open connection leaves room for
# the next on a fresh connection before the job's lease (or the stop) ends.
TRY_SHARE = 1 / 3
TRY_FLOOR_S = 0.25


def reply_lost(exc: BaseException) -> bool:
    """The command may have reached the server, and its answer was not read (a timeout, a lost connection).

    Then a claim may have taken jobs for its REQ.  An error reply is an
    answer (nothing ran), and ``NotSent`` never left: neither is a lost reply.
    """
    if isinstance(exc, (NotSent, rx.ResponseError)):
        return False
    return isinstance(exc, (rx.ConnectionError, rx.TimeoutError, OSError))


# -- errors and retries ------------------------------------------------------------


class Trouble(enum.Enum):
    """What an error from the server (or the way to it) means for retrying."""

    TRANSIENT = "transient"
    """Connection lost, timeout, server loading, out of memory, slot moving: retry, it heals."""
    PERMANENT = "permanent"
    """ACL refusal, read-only replica, module missing, wrong key type, a bug: retrying will not heal it."""


def trouble(exc: BaseException) -> Trouble:
    """Classify an exception raised by a command."""
    if isinstance(exc, (ModuleNotLoaded, CorruptQueue, BadArgument)):
        return Trouble.PERMANENT
    if isinstance(exc, (rx.NoPermissionError, rx.ReadOnlyError, rx.AuthenticationError)):
        return Trouble.PERMANENT
    if isinstance(exc, (rx.ConnectionError, rx.TimeoutError, OSError)):  # BusyLoadingError too
        return Trouble.TRANSIENT
    if isinstance(exc, (rx.OutOfMemoryError, rx.TryAgainError, rx.ClusterDownError, rx.MasterDownError)):
        return Trouble.TRANSIENT
    if isinstance(exc, rx.ResponseError) and str(exc).startswith(("LOADING", "BUSY", "TRYAGAIN")):
        return Trouble.TRANSIENT
    return Trouble.PERMANENT


class Troubles:
    """The errors one worker (or reaper) met: every one counted, each kind logged once.

    A transient error starts an "outage", logged once at WARNING; the first
    success after it is logged at INFO ("reachable again").  A permanent
    error is logged at ERROR the first time its kind (type and first word)
    is seen, with its cause, and at DEBUG after that.  Thread-safe.
    """

    def __init__(self, log: logging.Logger, what: str, stats: WorkerStats | None = None) -> None:
        self.log, self.what, self.stats = log, what, stats
        self.transient = 0
        self.permanent = 0
        self.last_permanent: str | None = None
        self._outage = False
        self._seen: set[tuple[str, str]] = set()
        self._lock = threading.Lock()

    def report(self, exc: BaseException, doing: str, job: Job | None = None) -> Trouble:
        """Count ``exc`` (met while ``doing``), log it if it is news; returns its kind."""
        kind = trouble(exc)
        extra = job_fields(job) if job is not None else None
        with self._lock:
            if kind is Trouble.TRANSIENT:
                self.transient += 1
                news, self._outage = not self._outage, True
            else:
                self.permanent += 1
                self.last_permanent = f"{type(exc).__name__}: {exc}"
                key = (type(exc).__name__, str(exc).split(" ", 1)[0])
                news = key not in self._seen
                self._seen.add(key)
            if self.stats is not None:
                self.stats.connection_errors = self.transient
                self.stats.permanent_errors = self.permanent
                self.stats.last_permanent_error = self.last_permanent
        if kind is Trouble.TRANSIENT:
            level = logging.WARNING if news else logging.DEBUG
            self.log.log(
                level,
                "%s: %s failed, retrying: %s: %s",
                self.what,
                doing,
                type(exc).__name__,
                exc,
                extra=extra,
            )
        elif news:
            # The cause, once; retrying goes on (an operator may fix an ACL or
            # load the module), but it will not heal by itself.  Not a server's
            # answer at all (a bug): with its traceback.
            bug = not isinstance(exc, (rx.RedisError, EchoMQError))
            self.log.error(
                "%s: %s refused: %s: %s (retrying will not fix this; it is counted in the stats)",
                self.what,
                doing,
                type(exc).__name__,
                exc,
                extra=extra,
                exc_info=exc if bug else None,
            )
        else:
            self.log.debug("%s: %s refused again: %s", self.what, doing, exc, extra=extra)
        return kind

    def healed(self) -> None:
        """A command went through: an outage in progress is over."""
        if not self._outage:  # the common case, read without the lock: a worker calls this per command
            return
        with self._lock:
            was, self._outage = self._outage, False
        if was:
            self.log.info("%s: the server answers again", self.what)


class Backoff:
    """Sending one command again until it lands or ``until`` passes.

    ``timeout()`` is how long to wait for the current attempt's reply
    (``ATTEMPT_TIMEOUT_S``, doubling per attempt to ``ATTEMPT_TIMEOUT_CAP_S``,
    never more than ``TRY_SHARE`` of the time left before ``until`` unless
    that is under ``TRY_FLOOR_S``, never past ``until``); ``next_wait(now)`` is the pause before the next
    attempt (``RETRY_FIRST_S`` doubling to ``RETRY_CAP_S``, jittered), or
    None when ``until`` has passed: give up.
    """

    def __init__(self, until: float | None = None, *, jitter: Callable[[], float] = random.random) -> None:
        self.until = until
        self.attempts = 0
        self._jitter = jitter

    def timeout(self, now: float) -> float:
        wait: float = min(ATTEMPT_TIMEOUT_S * 2.0 ** min(self.attempts, 16), ATTEMPT_TIMEOUT_CAP_S)
        if self.until is not None:
            left = self.until - now
            wait = min(wait, max(left * TRY_SHARE, TRY_FLOOR_S), left)
        return max(wait, 0.001)

    def next_wait(self, now: float) -> float | None:
        if self.until is not None and now >= self.until:
            return None
        wait: float = min(RETRY_FIRST_S * 2.0 ** min(self.attempts, 16), RETRY_CAP_S)
        wait *= 0.5 + self._jitter() / 2  # spread the herd of workers that lost the server together
        self.attempts += 1
        if self.until is not None:
            wait = min(wait, self.until - now)
        return max(wait, 0.0)
