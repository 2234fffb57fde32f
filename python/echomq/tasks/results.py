"""The rules of a wait for a job's end, without I/O: ``echomq._results``'s, re-exported where they were.

A client waits too (``client.result``), so the rules live below the drivers;
their drivers are ``echomq._result_wait`` (``tasks.wait`` re-exports them).
"""

from __future__ import annotations

from .._results import ENDED, READ_EVERY_S, ResultWait, Settled, is_announcement, is_confirmation

__all__ = ["ENDED", "READ_EVERY_S", "ResultWait", "Settled", "is_announcement", "is_confirmation"]
