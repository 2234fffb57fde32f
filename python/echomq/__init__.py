"""EchoMQ native: lifecycle controls for a Redis-backed job queue.

The emq Redis module gives a queue native, atomic, server-clocked commands
(EMQ.ENQUEUE, CLAIM, EXTEND, CHECKPOINT, COMPLETE, FAIL, RELEASE, CANCEL, SWEEP);
this package wraps them, and adds a cooperative cancel token and a worker
runtime (Worker, LeaseKeeper, Reaper; a handler gets a JobContext).  ``echomq.asyncio`` has the same over
``redis.asyncio``; ``echomq.testing`` starts a throwaway server for tests.

    client = echomq.Client.from_url("redis://localhost:6379")
    client.enqueue("emails", b'{"to": "ada"}')
    echomq.Worker(client, "emails", handler, lease_ms=30_000).run()
"""

from __future__ import annotations

from . import keyspace
from ._log import configure_logging
from ._module_so import module_path
from ._protocol import KEEP_FOREVER
from ._protocol.deps import OnParentFailure, Parents
from ._protocol.unique import Enqueued
from ._version import __version__ as __version__
from .cancel import Cancellation, CancelToken
from .client import (
    ActiveJob,
    Client,
    DeadJob,
    ExtendOutcome,
    GroupDefault,
    GroupInfo,
    Job,
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
from .context import JobContext, Progress
from .errors import (
    BadArgument,
    BadSchedule,
    Cancelled,
    CorruptQueue,
    EchoMQError,
    JobCancelled,
    JobExists,
    JobFailed,
    JobGone,
    LeaseLost,
    ModuleNotLoaded,
    NonRetryable,
    NotReplicated,
    NotRetryable,
    PartitionsChanged,
    QueueBusy,
    RateLimited,
    ResultTimeout,
    RetryLater,
    ServerUnreachable,
    StaleToken,
    Unblocked,
)
from .lease import LeaseKeeper
from .reaper import Reaper
from .retry import RetryPolicy
from .schedules import DriveResult, Schedule, ScheduleInfo
from .tasks import App, Task, TaskHandle
from .tasks import context as task_context
from .worker import Worker, WorkerStats

__all__ = [
    "KEEP_FOREVER",
    "ActiveJob",
    "App",
    "BadArgument",
    "BadSchedule",
    "CancelToken",
    "Cancellation",
    "Cancelled",
    "Client",
    "CorruptQueue",
    "DeadJob",
    "DriveResult",
    "EchoMQError",
    "Enqueued",
    "ExtendOutcome",
    "GroupDefault",
    "GroupInfo",
    "Job",
    "JobCancelled",
    "JobContext",
    "JobExists",
    "JobFailed",
    "JobGone",
    "JobInfo",
    "LeaseKeeper",
    "LeaseLost",
    "ModuleNotLoaded",
    "NonRetryable",
    "NotReplicated",
    "NotRetryable",
    "ObliterateResult",
    "OnParentFailure",
    "Parents",
    "PartitionsChanged",
    "PendingJob",
    "Progress",
    "QueueBusy",
    "QueueCounters",
    "QueueCounts",
    "RateLimit",
    "RateLimited",
    "Reaper",
    "ResultTimeout",
    "Retention",
    "RetryDeadResult",
    "RetryLater",
    "RetryPolicy",
    "Schedule",
    "ScheduleInfo",
    "ScriptLimits",
    "ServerUnreachable",
    "StaleToken",
    "SweepResult",
    "Task",
    "TaskHandle",
    "Unblocked",
    "Worker",
    "WorkerStats",
    "configure_logging",
    "keyspace",
    "module_path",
    "task_context",
]

