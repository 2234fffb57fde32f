"""What the worker runtime tells its metrics: the interface ``echomq.metrics.Metrics`` implements.

The metrics are a capability over the drivers (Prometheus, the queue's
shared counters); the runtime and the drivers only call them, at a claim,
a delivered cancel, a lost lease, a job's end and a sweep.  So the calls
are named here, as a Protocol, and ``echomq.metrics`` is never imported
below it.
"""

from __future__ import annotations

from typing import Any, Protocol

from .._protocol import Job, SweepResult

__all__ = ["Metrics"]


class Metrics(Protocol):
    """A worker's or a reaper's metrics (``echomq.metrics.Metrics`` is one): what they are told."""

    def bind(self, client: Any) -> None:
        """Lend the metrics a server: the Worker's or Reaper's client."""
        ...

    def flush(self) -> None:
        """Send out what is still held (a worker's stop)."""
        ...

    def claimed(self, job: Job, wait_ms: int | None = None) -> None:
        """A job was claimed; ``wait_ms``, its enqueue-to-claim wait when it was measured."""
        ...

    def claimed_with_wait(self, client: Any, job: Job) -> None:
        """``claimed``, its wait read with the thread driver's ``client`` when the metrics want it."""
        ...

    async def aclaimed_with_wait(self, client: Any, job: Job) -> None:
        """``claimed``, its wait read with the asyncio driver's ``client``."""
        ...

    def cancel_delivered(self, job: Job) -> None:
        """A checkpoint brought a remote cancel for ``job``."""
        ...

    def lease_lost(self, job: Job, reason: str) -> None:
        """The holder lost ``job``'s lease (``reason``, the lease keeper's)."""
        ...

    def finished(self, job: Job, outcome: str, run_seconds: float | None = None) -> None:
        """The handler's run of ``job`` ended (``outcome``: see ``echomq.metrics.Metrics.finished``)."""
        ...

    def swept(self, queue: str, result: SweepResult) -> None:
        """What a sweep (or a tick of them) of ``queue`` did."""
        ...
