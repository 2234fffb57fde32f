"""Waiting for a server at start, without I/O: both drivers' ``wait_for_server`` drive a ``StartWait``.

A worker started while its server is down waits for it (``--wait-for-server S``)
instead of exiting 1: one PING per try, the pause between tries doubling from
0.1 s to ``START_WAIT_CAP_S``, one log line when the wait begins and one when it ends.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from ..errors import ServerUnreachable

__all__ = ["START_WAIT_CAP_S", "StartWait", "ping_target"]

log = logging.getLogger("echomq.worker")

START_WAIT_CAP_S = 2.0
"""The longest pause between two PINGs while waiting at start."""


def ping_target(redis_client: Any) -> dict[str, Any]:
    """PING's options: a cluster client is told to ask any node (the command has no key)."""
    if hasattr(redis_client, "get_random_node"):
        return {"target_nodes": redis_client.get_random_node()}
    return {}


class StartWait:
    """One wait for a server: after each failed PING, ``failed`` says how long to pause (or raises)."""

    def __init__(self, seconds: float, where: str, now: float | None = None) -> None:
        self.seconds, self.where = seconds, where
        self.deadline = (time.monotonic() if now is None else now) + seconds
        self._pause, self._said = 0.1, False

    def failed(self, exc: BaseException, now: float | None = None) -> float:
        """The pause before the next PING; ``ServerUnreachable`` (from ``exc``) once the time is up."""
        left = self.deadline - (time.monotonic() if now is None else now)
        if left <= 0:
            waited = f"waited {self.seconds:.3g} s"
            raise ServerUnreachable(f"cannot reach {self.where} ({waited}): {exc}") from exc
        if not self._said:
            log.warning("waiting up to %.3g s for %s: %s", self.seconds, self.where, exc)
            self._said = True
        pause = min(self._pause, left)
        self._pause = min(self._pause * 2, START_WAIT_CAP_S)
        return pause

    def answered(self) -> None:
        """The server answered: say so if the wait was said to begin."""
        if self._said:
            log.info("%s answers: starting", self.where)
