"""The wait for a job's end, driven with threads and with asyncio: ``echomq._result_wait``'s, re-exported.

Both clients call it (``client.result``), so it lives beside them; its rules
are ``echomq._results`` (``tasks.results`` re-exports them).
"""

from __future__ import annotations

from .._result_wait import await_result, wait_result

__all__ = ["await_result", "wait_result"]
