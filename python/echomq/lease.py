"""``echomq.LeaseKeeper`` and the reasons a lease is lost:
the public face of the sync driver's ``_sync/lease.py``.

The sync driver lives in ``echomq/_sync/`` beside ``echomq/asyncio/``, file for
file; this module keeps the import path users have (``echomq.lease.*``).
"""

from __future__ import annotations

from ._sync.lease import (
    LOST_DEADLINE,
    LOST_GONE,
    LOST_STALE,
    LeaseKeeper,
    SharedKeeper,
    lost_reason,
)

__all__ = [
    "LOST_DEADLINE",
    "LOST_GONE",
    "LOST_STALE",
    "LeaseKeeper",
    "SharedKeeper",
    "lost_reason",
]
