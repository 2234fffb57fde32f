"""A worker of a partitioned queue (docs/concepts/partitions.md): which partition each claim and
each sweep goes to, for both drivers.

A worker on a declared queue is the ordinary worker with a few of its small calls replaced at
its start (``adopt``), so a queue never declared takes no new branch on any path:

- **Claims rotate**: each claim (the idle one, or the one riding with a batch of ends) goes
  to the next partition, so a busy worker never starves one; EMQ.COMPLETECLAIM is off (its
  claim would stay in the finished job's partition).
- **The idle wait** is one waiting claim at a time, on one partition, ``PARTITION_BLOCK_S``
  long (a sixth of the lease at most), then the next: about 0.4 commands/s, its sweeps
  besides.  A job arriving in a partition the wait is not on is claimed when the rotation
  reaches it, within K waits.
- **Sweeps rotate** the same way, a partition a turn (each partition swept every K turns of
  one worker, every K/W of W workers).
- Pushed cancels listen on the logical name only: a running job of a partition hears of its
  cancel at its next checkpoint.
"""

from __future__ import annotations

from typing import Any

from .. import _protocol as proto
from .._protocol import Call, Job, SweepResult
from .sweep import REAP_LIMIT

# An idle partitioned worker's waiting claim: this long on one partition, then the next.
PARTITION_BLOCK_S = 2.5


class Rotation:
    """The partitions in turn, starting at ``start``."""

    def __init__(self, names: tuple[str, ...], start: int = 0) -> None:
        self.names = names
        self.at = start % len(names)

    def next(self) -> str:
        name = self.names[self.at]
        self.at = (self.at + 1) % len(self.names)
        return name


def block_ms(lease_ms: int) -> int:
    return max(1, round(min(PARTITION_BLOCK_S * 1000, lease_ms / 6)))


def adopt(worker: Any, names: tuple[str, ...], start: int = 0) -> None:
    """Make ``worker`` (either driver's, not started yet) claim and sweep across ``names``."""
    claims, sweeps = Rotation(names, start), Rotation(names, start)
    lease_ms, wait_ms = worker.lease_ms, block_ms(worker.lease_ms)
    sweeping = [names[start % len(names)]]

    def claim_call(block: int | None = None, count: int = 1) -> Call[list[Job]]:
        return proto.claim(claims.next(), lease_ms, count, None if block is None else wait_ms)

    reap_tick = worker._reap_tick

    def next_reap_tick() -> Any:
        sweeping[0] = sweeps.next()
        return reap_tick()

    def reap_call() -> Call[SweepResult]:
        return proto.sweep(sweeping[0], worker.max_stalled, REAP_LIMIT)

    worker._claim_call = claim_call
    worker._reap_tick = next_reap_tick
    worker._reap_call = reap_call
    worker._complete_claim = False
    worker.partitions = names
