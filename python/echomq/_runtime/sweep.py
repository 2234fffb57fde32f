"""Sweeping: one reaper tick (``SweepTick``: a full batch, sweep again, bounded), the reapers'
core, and the sweep every worker runs itself (``ReapSchedule``, ``Reaping``)."""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import TYPE_CHECKING, Generic, TypeVar

from .. import _protocol as proto
from .._protocol import Call, SweepResult, keys_of
from .args import check_callable, check_client, check_int, check_seconds
from .logs import reaper_log, worker_log
from .stats import WorkerStats
from .troubles import Troubles

if TYPE_CHECKING:
    from .metrics import Metrics

ClientT = TypeVar("ClientT")


# A sweep that took `limit` jobs may have left more behind: sweep again, but
# never spin forever on one tick.
MAX_SWEEPS_PER_TICK = 100
# A worker's own sweep (reap=True): at most this many lapsed jobs per EMQ.SWEEP,
# and at most this many EMQ.SWEEPs a turn (a full one: sweep again).  Small:
# every worker of a queue sweeps, and one turn must never hold the server long.
REAP_LIMIT = 20
REAP_SWEEPS_PER_TURN = 5
# How long a worker's sweep waits for its answer (one try a turn: a sweep
# whose answer was lost took what it took, and the next turn takes the rest).
REAP_TIMEOUT_S = 2.0

# -- the reaper ------------------------------------------------------------------


class SweepTick:
    """One reaper tick: sweep again while a sweep took a full batch, at most ``max_sweeps`` times."""

    def __init__(self, limit: int, max_sweeps: int = MAX_SWEEPS_PER_TICK) -> None:
        self.limit, self.max_sweeps = limit, max_sweeps
        self.sweeps = 0
        self.recovered: list[str] = []
        self.dead: list[str] = []
        self.cancelled: list[str] = []
        self.expired = 0
        self._full = True

    def wants_more(self) -> bool:
        """True while another sweep may find lapsed jobs and the tick's bound allows it."""
        return self._full and self.sweeps < self.max_sweeps

    def add(self, result: SweepResult) -> None:
        self.sweeps += 1
        self.recovered += result.recovered
        self.dead += result.dead
        self.cancelled += result.cancelled
        self.expired += result.expired
        self._full = len(result) >= self.limit

    @property
    def total(self) -> SweepResult:
        return SweepResult(list(self.recovered), list(self.dead), list(self.cancelled), self.expired)


class ReapSchedule:
    """When a worker sweeps next: every ``interval`` seconds on average, each wait drawn from
    [interval / 2, 3 * interval / 2], so workers started together do not sweep in lockstep.

    The first turn comes after such a wait too: a fleet restarted at once
    spreads its sweeps from the start.
    """

    def __init__(self, interval: float, now: float, *, jitter: Callable[[], float] = random.random):
        self.interval = interval
        self._jitter = jitter
        self.next_at = now + self._draw()

    def _draw(self) -> float:
        return self.interval * (0.5 + self._jitter())

    def wait(self, now: float) -> float:
        """Seconds until the next turn (0.0: now)."""
        return max(0.0, self.next_at - now)

    def swept(self, now: float) -> None:
        """A turn ended (whatever it found, or failed): the next one a drawn wait later."""
        self.next_at = now + self._draw()


class Reaping:
    """The sweep every worker runs itself, for ``WorkerCore`` (``reap=True``, the default).

    Bounded (``REAP_LIMIT`` jobs per command, ``REAP_SWEEPS_PER_TURN``
    commands a turn), idempotent (a sweep is one atomic command: workers
    sweeping together never recover a job twice) and jittered
    (``ReapSchedule``).  A sweep also applies the dead retention.  What it
    did is counted in ``stats.reaped``, told to the metrics, and logged.
    """

    queue: str
    max_stalled: int
    stats: WorkerStats
    metrics: Metrics | None

    def _reap_call(self) -> Call[SweepResult]:
        return proto.sweep(self.queue, self.max_stalled, REAP_LIMIT)

    def _reap_tick(self) -> SweepTick:
        return SweepTick(REAP_LIMIT, REAP_SWEEPS_PER_TURN)

    def _reaped(self, tick: SweepTick) -> None:
        """A turn's sweeps ended: count, tell the metrics, log what they did."""
        total = tick.total
        taken = len(total.recovered) + len(total.dead) + len(total.cancelled)
        self.stats.reaped += taken
        if self.metrics is not None:
            self.metrics.swept(self.queue, total)
        if taken or total.expired:
            worker_log.info(
                "worker of %r swept: %d lapsed jobs recovered, %d dead-lettered, %d ended cancelled; "
                "%d dead jobs past their retention deleted",
                self.queue, len(total.recovered), len(total.dead), len(total.cancelled), total.expired,
            )  # fmt: skip


class ReaperCore(Generic[ClientT]):
    """What both ``Reaper`` classes share: the settings, checked, and the counts."""

    _client_type: type | None = None

    def __init__(
        self,
        client: ClientT,
        queue: str,
        *,
        interval: float = 1.0,
        max_stalled: int = 1,
        limit: int = 100,
        on_sweep: Callable[[SweepResult], None] | None = None,
        metrics: Metrics | None = None,
    ) -> None:
        check_client("client", client, self._client_type)
        keys_of(queue)
        check_seconds("interval", interval)
        check_int("max_stalled", max_stalled)
        check_int("limit", limit)
        if on_sweep is not None:
            check_callable("on_sweep", on_sweep)
        self.client, self.queue = client, queue
        self.metrics = metrics  # echomq.metrics.Metrics: told what each tick did
        if metrics is not None:
            metrics.bind(client)
        self.interval, self.max_stalled, self.limit = interval, max_stalled, limit
        self.on_sweep = on_sweep
        self.recovered = 0
        self.dead = 0
        self.cancelled = 0
        self.errors = 0
        self._troubles = Troubles(reaper_log, f"reaper of {queue!r}")
        self._init_driver()

    def _init_driver(self) -> None:
        """Make the driver's own thread or task primitives."""

    def _tick(self) -> SweepTick:
        return SweepTick(self.limit)

    def _swept(self, tick: SweepTick) -> SweepResult:
        """Count a finished tick, tell ``on_sweep`` if it did anything, return what it did."""
        self._troubles.healed()
        total = tick.total
        self.recovered += len(total.recovered)
        self.dead += len(total.dead)
        self.cancelled += len(total.cancelled)
        if self.metrics is not None:
            self.metrics.swept(self.queue, total)
        if (total or total.expired) and self.on_sweep is not None:
            self.on_sweep(total)
        return total

    def _sweep_failed(self, exc: BaseException) -> None:
        """Count a failed tick, logged once per outage or kind (no traceback each tick); retried next tick."""
        self.errors += 1
        self._troubles.report(exc, "sweep")
