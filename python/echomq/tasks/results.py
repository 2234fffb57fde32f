"""Waiting for a job's end, without polling: the rules (sans I/O) both drivers follow.

1. Subscribe to ``<base>done:<id>`` (SSUBSCRIBE where the server announces
   with SPUBLISH, else SUBSCRIBE: ``echomq._protocol.done_subscription``)
   and wait for the server to confirm it;
2. read the row with one HMGET (``ResultWait.read``): a job that ended
   before the subscription is seen here;
3. else wait for the message (a job that ends after the subscription is
   announced there), then read the row again.

So a wait sends a subscription, one HMGET, and one more per announcement:
nothing polls.  ``settle`` turns the row into the value, ``JobFailed``
(dead), ``JobCancelled`` or ``JobGone`` (no row: an unknown id, or one
whose row expired after its retention).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from .. import _protocol as proto
from .._protocol.views import joined, piece_fields
from ..errors import JobCancelled, JobFailed, JobGone, ResultTimeout
from .envelope import decode_result
from .serializers import JSON, Serializer

__all__ = ["ENDED", "ResultWait", "Settled"]

ENDED = ("done", "dead", "cancelled")
_FIELDS = ("state", "last_error", "traceback", "cancel_requested", *piece_fields("result"))


@dataclass(frozen=True, slots=True)
class Settled:
    """The job ended as done: its result's value."""

    value: Any


class ResultWait:
    """One wait for one job's end (``timeout`` None: no limit); the driver does the I/O."""

    def __init__(
        self, queue: str, job_id: str, timeout: float | None, now: float, serializer: Serializer = JSON
    ) -> None:
        proto.keys_of(queue)
        if timeout is not None and (
            isinstance(timeout, bool) or not isinstance(timeout, int | float) or not timeout >= 0
        ):
            raise ValueError(f"timeout must be a number of seconds >= 0 or None, got {timeout!r}")
        self.queue, self.job_id, self.timeout = queue, job_id, timeout
        self.deadline = math.inf if timeout is None else now + timeout
        self.serializer = serializer

    def channel(self) -> bytes:
        return proto.done_channel(self.queue, self.job_id)

    def read(self) -> tuple[Any, ...]:
        """The one command that reads what settling needs from the row."""
        return ("HMGET", proto.keys_of(self.queue).job(proto.wire(self.job_id)), *_FIELDS)

    def settle(self, values: list[Any]) -> Settled | None:
        """The HMGET's answer: the value when done; raises for dead, cancelled or gone; None while it runs."""
        state = proto.text(values[0]) if values[0] is not None else None
        if state is None:
            raise JobGone(
                f"job {self.job_id!r} of queue {self.queue!r} has no row (an unknown id, or its row expired "
                "after the queue's retention)",
                self.job_id,
            )
        if state == "done":
            return Settled(decode_result(joined(values[4:]), self.serializer))
        if state == "dead":
            error = proto.text(values[1]) if values[1] is not None else "unknown: no error was recorded"
            kind, _, message = error.partition(": ")
            trace = values[2].decode("utf-8", "replace") if values[2] is not None else None
            raise JobFailed(self.queue, self.job_id, kind, message, trace)
        if state == "cancelled":
            reason = proto.text(values[3]) if values[3] is not None else None
            raise JobCancelled(self.queue, self.job_id, reason or None)
        return None

    def remaining(self, now: float) -> float | None:
        """Seconds left to wait (None: no limit); ``ResultTimeout`` once none are left."""
        if self.deadline == math.inf:
            return None
        left = self.deadline - now
        if left <= 0:
            raise ResultTimeout(self.queue, self.job_id, self.timeout or 0.0)
        return left


def is_announcement(message: Any) -> bool:
    """A pub/sub message that announces the end (not a subscription's confirmation)."""
    return isinstance(message, dict) and message.get("type") in ("message", "smessage")


def is_confirmation(message: Any) -> bool:
    return isinstance(message, dict) and message.get("type") in ("subscribe", "ssubscribe")
