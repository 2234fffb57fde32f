"""Key names of a queue.

A queue named ``Q`` lives under the base ``emq:{Q}:``.  The braces are a Redis
Cluster hash tag: every key of one queue hashes to one slot, so one command
may touch all of them, on a single server or in a cluster.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import overload

__all__ = ["QueueKeys", "queue_keys"]


@dataclass(frozen=True)
class QueueKeys:
    """The keys of one queue (docs/reference/keyspace.md says what each holds)."""

    queue: str
    base: str
    active: str
    pending: str
    """The default lane: a list of the ids of claimable priority-0 jobs (with tombstones)."""
    dead: str
    metrics_failed: str
    meta: str
    """The queue's settings: ``paused``, and the retention of finished rows."""
    cancel_channel: str
    """Where EMQ.CANCEL announces a request for a held job (its id)."""
    priority: str = ""
    """The other lanes: claimable jobs of a priority other than 0, a sorted set."""
    delayed: str = ""
    """Jobs not due yet, a sorted set scored with their due time."""

    @overload
    def job(self, job_id: str) -> str: ...
    @overload
    def job(self, job_id: bytes) -> bytes: ...
    def job(self, job_id: str | bytes) -> str | bytes:
        """The job row's key; bytes in, bytes out (ids may be binary)."""
        if isinstance(job_id, bytes):
            return self.base.encode() + b"job:" + job_id
        return f"{self.base}job:{job_id}"


def queue_keys(queue: str) -> QueueKeys:
    """Return the key names of ``queue``.

    Raises ValueError for an empty name or one containing ``{`` or ``}``:
    either would break the hash tag that keeps the queue in one slot.
    """
    if not isinstance(queue, str):
        raise TypeError(f"queue name must be a str, not {type(queue).__name__}")
    if not queue:
        raise ValueError("queue name must not be empty")
    if "{" in queue or "}" in queue:
        raise ValueError(f"queue name {queue!r} must not contain '{{' or '}}' (it is the hash tag)")
    base = f"emq:{{{queue}}}:"
    return QueueKeys(
        queue=queue,
        base=base,
        active=base + "active",
        pending=base + "pending",
        dead=base + "dead",
        metrics_failed=base + "metrics:failed",
        meta=base + "meta",
        cancel_channel=base + "cancel",
        priority=base + "priority",
        delayed=base + "delayed",
    )
