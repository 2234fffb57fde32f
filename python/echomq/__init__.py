"""EchoMQ native: lifecycle controls for a Redis-backed job queue.

The emq Redis module gives a queue native, atomic, server-clocked commands
(EMQ.EXTEND, EMQ.SWEEP); this package wraps them and adds a cooperative
cancel token.

    client = echomq.Client.from_url("redis://localhost:6379")
    client.extend("emails", job_id, token=attempts, lease_ms=30_000)
    result = client.sweep("emails", max_stalled=3)
"""

from __future__ import annotations

from . import keyspace
from .cancel import Cancellation, CancelToken
from .client import Client, ExtendOutcome, Job, SweepResult
from .errors import (
    Cancelled,
    EchoMQError,
    JobExists,
    JobGone,
    LeaseLost,
    ModuleNotLoaded,
    StaleToken,
)
from .lease import LeaseKeeper
from .reaper import Reaper
from .server import EmbeddedServer, module_path
from .worker import Worker, WorkerStats

__all__ = [
    "CancelToken",
    "Cancellation",
    "Cancelled",
    "Client",
    "EchoMQError",
    "EmbeddedServer",
    "ExtendOutcome",
    "Job",
    "JobExists",
    "JobGone",
    "LeaseKeeper",
    "LeaseLost",
    "ModuleNotLoaded",
    "Reaper",
    "StaleToken",
    "SweepResult",
    "Worker",
    "WorkerStats",
    "keyspace",
    "module_path",
]

__version__ = "0.1.0"
