"""``echomq.Client`` and what it returns: the public face of the sync driver's ``_sync/client.py``.

The sync driver lives in ``echomq/_sync/`` beside ``echomq/asyncio/``, file for
file; this module keeps the import path users have (``echomq.client.*``).
"""

from __future__ import annotations

from ._sync.client import (
    ActiveJob,
    Client,
    DeadJob,
    ExtendOutcome,
    GroupDefault,
    GroupInfo,
    Job,
    JobId,
    JobInfo,
    ObliterateResult,
    PendingJob,
    QueueCounters,
    QueueCounts,
    RateLimit,
    Retention,
    RetryDeadResult,
    ScriptLimits,
    SweepResult,
)

__all__ = [
    "ActiveJob",
    "Client",
    "DeadJob",
    "ExtendOutcome",
    "GroupDefault",
    "GroupInfo",
    "Job",
    "JobId",
    "JobInfo",
    "ObliterateResult",
    "PendingJob",
    "QueueCounters",
    "QueueCounts",
    "RateLimit",
    "Retention",
    "RetryDeadResult",
    "ScriptLimits",
    "SweepResult",
]
