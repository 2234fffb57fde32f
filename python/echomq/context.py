"""``echomq.JobContext``, what a handler gets: the public face of the sync driver's ``_sync/context.py``.

The sync driver lives in ``echomq/_sync/`` beside ``echomq/asyncio/``, file for
file; this module keeps the import path users have (``echomq.context.*``).
"""

from __future__ import annotations

from ._sync.context import (
    JobContext,
    Progress,
)

__all__ = [
    "JobContext",
    "Progress",
]
