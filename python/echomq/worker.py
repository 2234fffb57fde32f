"""``echomq.Worker``, its stats and the handler's types:
the public face of the sync driver's ``_sync/worker.py``.

The sync driver lives in ``echomq/_sync/`` beside ``echomq/asyncio/``, file for
file; this module keeps the import path users have (``echomq.worker.*``).
"""

from __future__ import annotations

from ._sync.worker import (
    Handler,
    JobContext,
    Worker,
    WorkerStats,
    error_text,
)

__all__ = [
    "Handler",
    "JobContext",
    "Worker",
    "WorkerStats",
    "error_text",
]
