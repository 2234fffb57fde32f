"""A worker of a partitioned queue (docs/concepts/partitions.md): which partition each claim and
each sweep goes to, for both drivers.

A worker on a declared queue is the ordinary worker with a few of its small calls replaced at
its first claim, once it has read the declaration (each driver's ``hook_worker``, then
``adopt``); a worker of a queue never declared drops the hook with that claim, so no later
claim and no job takes a new branch:

- **Claims rotate**: each claim (the idle one, or the one riding with a batch of ends) goes
  to the next partition, so a busy worker never starves one; EMQ.COMPLETECLAIM is off (its
  claim would stay in the finished job's partition).
- **The idle wait**: once a whole rotation of claims came back empty, the worker subscribes
  to its partitions' wake channels (``<base>wake``, SPUBLISHed by the producers after each
  enqueue into a partition: ``wake_channel``), claims around the rotation once more (a job
  that came before the subscription), then waits: a wake sends the next claim to the
  partition it names at once; without one, a claim every ``IDLE_CLAIM_S`` goes on around the
  rotation (a wake lost with a dropped subscription waits for it).  The first claim that
  rides with ends (the worker is busy) ends the subscription: a busy worker hears no wakes.
- **Sweeps rotate** the same way, a partition a turn (each partition swept every K turns of
  one worker, every K/W of W workers).
- Pushed cancels: the worker's one cancel subscription listens to every partition's
  ``<base>cancel`` (``CancelListener.listen_to``).
"""

from __future__ import annotations

from typing import Any

from .. import _protocol as proto
from .._protocol import Call, Job, SweepResult
from .sweep import REAP_LIMIT

# An idle worker's claim (one partition, around the rotation) every so often, wakes or not:
# the bound on a wake lost with a dropped subscription (K of these).
IDLE_CLAIM_S = 5.0


def wake_channel(name: str) -> str:
    """The channel a producer announces a job on, in its partition's slot (``SPUBLISH``)."""
    return proto.keys_of(name).base + "wake"


class IdleWakes:
    """An idle worker's state between its claims and its wakes (no I/O: each driver's listener
    subscribes while ``wanted`` and feeds ``woken``).

    ``claimed(jobs)`` after every idle claim says how long to wait for a wake before the next
    (0: claim on at once).
    """

    def __init__(self, partitions: int) -> None:
        self.partitions = partitions
        self.empties = 0
        self.wanted = False  # the listener subscribes while this is True
        self.subscribed = False  # the listener's subscription is made
        self.pending: list[int] = []  # partitions woken, oldest first

    def claimed(self, jobs: int) -> float:
        """After an idle claim: the seconds to wait for a wake before the next one."""
        if jobs:  # the subscription stays: the wakes still pending go first
            self.empties = 0
            return 0.0
        self.empties += 1
        if self.empties < self.partitions:
            return 0.0
        if not self.subscribed:  # subscribe, then once more around (a job from before it)
            self.wanted = True
            self.empties = 0
            return 0.0
        return IDLE_CLAIM_S

    def busy(self) -> None:
        """A claim rode with ends (the worker is busy): no wakes until it idles again."""
        self.empties = 0
        self.wanted = False

    def woken(self, index: int) -> None:
        if index not in self.pending:
            self.pending.append(index)

    def next_woken(self) -> int | None:
        return self.pending.pop(0) if self.pending else None


class Rotation:
    """The partitions in turn, starting at ``start``."""

    def __init__(self, names: tuple[str, ...], start: int = 0) -> None:
        self.names = names
        self.at = start % len(names)

    def next(self) -> str:
        name = self.names[self.at]
        self.at = (self.at + 1) % len(self.names)
        return name


def adopt(worker: Any, names: tuple[str, ...], start: int, wakes: IdleWakes) -> None:
    """Make ``worker`` (either driver's) claim and sweep across ``names``: its claims never wait
    on the server (the driver waits for a wake between them: ``IdleWakes``)."""
    claims, sweeps = Rotation(names, start), Rotation(names, start)
    lease_ms = worker.lease_ms
    sweeping = [names[start % len(names)]]

    def claim_call(block: int | None = None, count: int = 1) -> Call[list[Job]]:
        if block is None:  # a claim with ends, not an idle one
            wakes.busy()
        woken = wakes.next_woken()
        return proto.claim(claims.next() if woken is None else names[woken], lease_ms, count)

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
    worker._partition_rotation = claims  # where the claims are (the tests aim a job behind it)
