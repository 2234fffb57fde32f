"""``echomq.Reaper``: the public face of the sync driver's ``_sync/reaper.py``.

The sync driver lives in ``echomq/_sync/`` beside ``echomq/asyncio/``, file for
file; this module keeps the import path users have (``echomq.reaper.*``).
"""

from __future__ import annotations

from ._sync.reaper import (
    Reaper,
)

__all__ = [
    "Reaper",
]
