"""Sweeping: one reaper tick (``SweepTick``: a full batch, sweep again, bounded) and the reapers' core."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Generic, TypeVar

from .._protocol import SweepResult, keys_of
from .args import check_callable, check_client, check_int, check_seconds
from .logs import reaper_log
from .troubles import Troubles

if TYPE_CHECKING:
    from ..metrics import Metrics

ClientT = TypeVar("ClientT")


# A sweep that took `limit` jobs may have left more behind: sweep again, but
# never spin forever on one tick.
MAX_SWEEPS_PER_TICK = 100

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
