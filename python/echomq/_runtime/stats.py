"""What a worker counts."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class WorkerStats:
    """What a worker did (counts since it was created)."""

    completed: int = 0
    failed: int = 0
    cancelled: int = 0  # ended by a remote cancel (EMQ.CANCEL)
    released: int = 0  # given back without using an attempt (a shutdown, a lease lost to its deadline)
    leases_lost: int = 0  # the lease was lost (or could not be shown) before the job's end landed
    rejected: int = 0  # complete/fail/release refused with StaleToken/JobGone
    connection_errors: int = 0  # commands that met a connection error or timeout (each was retried)
    permanent_errors: int = 0  # refusals retrying will not heal: NOPERM, READONLY, WRONGTYPE, no module
    last_permanent_error: str | None = None
    not_replicated: int = 0  # claimed jobs given back unrun: the replicas did not confirm them (replicas=)
    timed_out: int = 0  # handlers whose token was cancelled with "timeout" (timeout_ms)
    abandoned: int = 0  # handlers still running a grace past their timeout: their jobs failed without them
    reaped: int = 0  # lapsed jobs this worker's own sweeps took: recovered, dead-lettered or ended cancelled

    def record_fail(self, where: str) -> None:
        """Count a FAIL by where it sent the job."""
        if where == "cancelled":
            self.cancelled += 1
        else:
            self.failed += 1
