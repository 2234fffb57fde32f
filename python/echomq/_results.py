"""A task's stored result, and the wait for a job's end on its announcement: the rules, without I/O.

A result is ``<serializer>\n<bytes>`` (``json\n42``, ``encode_result``):
whoever reads it knows how, and refuses a pickle unless it was given the
pickle serializer (``decode_result``).  A client reads it too
(``client.result``), so it lives below the drivers; ``echomq.tasks``
re-exports these names where they were (``envelope``, ``results``).

The wait both drivers follow (``_result_wait.py`` drives it):

1. Subscribe to ``<base>done:<id>`` (SSUBSCRIBE where the server announces
   with SPUBLISH, else SUBSCRIBE: ``echomq._protocol.done_subscription``)
   and wait for the server to confirm it;
2. read the row with one HMGET (``ResultWait.read``) after every
   confirmation: the first one (a job that ended before the subscription
   is seen here), and every one after redis-py subscribed again by itself
   on a connection that dropped -- an announcement published while the
   subscription was away is gone, the row is not;
3. else wait for the message (a job that ends after the subscription is
   announced there), then read the row again;
4. read it again anyway once ``READ_EVERY_S`` passed without a read: a
   message lost some other way (a half-open subscription hears nothing)
   delays the wait's end by that much, never by the whole wait;
5. a connection that fails -- subscribing, listening or reading -- once
   the server has answered the wait is given up, and the wait subscribes
   again on a fresh one after a pause (``_runtime.Backoff``: 50 ms
   doubling to 1 s), never past the deadline; that subscription's
   confirmation reads the row (2).  A wait with no timeout tries on; one
   whose deadline passes raises ``ResultTimeout``, its ``__cause__`` the
   last connection error.  A refused connection to a server that neither
   the wait nor its client ever reached (a wrong address, a server not
   started: ``echomq._redis.never_reached``) is the caller's at once, as
   any call's would be.

So a quiet wait sends a subscription, one HMGET, and one more per
announcement and per ``READ_EVERY_S``.  ``settle`` turns the row into the
value, ``JobFailed`` (dead), ``JobCancelled`` or ``JobGone`` (no row: an
unknown id, or one whose row expired after its retention).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from . import _protocol as proto
from ._protocol.views import joined, piece_fields
from ._runtime.troubles import Backoff
from ._serializers import JSON, Serializer
from .errors import JobCancelled, JobFailed, JobGone, ResultTimeout

__all__ = [
    "ENDED", "READ_EVERY_S", "BadTaskPayload", "ResultWait", "Settled", "decode_result", "encode_result",
    "is_announcement", "is_confirmation",
]  # fmt: skip


class BadTaskPayload(ValueError):
    """A payload that is not a task call this worker can read (not a task job, or an unknown serializer)."""


def encode_result(serializer: Serializer, value: Any, name: str) -> bytes:
    """A task's return value as stored with its job (``SerializationError`` if it cannot be carried)."""
    return serializer.name.encode() + b"\n" + serializer.dumps(value, f"the result of task {name!r}")


def decode_result(data: bytes | None, serializer: Serializer = JSON) -> Any:
    """A stored result's value: None when there is none; an error for one ``serializer`` cannot read."""
    if data is None:
        return None
    name, newline, body = data.partition(b"\n")
    if not newline or name.decode("ascii", "replace") != serializer.name:
        shown = name.decode("ascii", "replace") if newline else "no serializer's"
        raise BadTaskPayload(
            f"the result was stored in {shown!r} form; read it with that serializer "
            f"(this reader uses {serializer.name!r})"
        )
    return serializer.loads(body)

ENDED = ("done", "dead", "cancelled")
# A wait reads the row at least this often, whatever it hears: the bound on
# what a lost announcement costs.
READ_EVERY_S = 5.0
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
        self.read_by = now + READ_EVERY_S  # the safety net's next read (before any confirmation, too)
        self._backoff = Backoff(None if timeout is None else self.deadline)
        self._error: BaseException | None = None  # the last connection error, since the last read
        self.reached = False  # the server answered this wait once: a refusal after is it restarting

    def channel(self) -> bytes:
        return proto.done_channel(self.queue, self.job_id)

    def read(self, now: float | None = None) -> tuple[Any, ...]:
        """The one command that reads what settling needs from the row.

        ``now``: a driver's wait sends it now; the next safety-net read
        counts from here.
        """
        if now is not None:
            self.read_by = now + READ_EVERY_S
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
        self._backoff, self._error = Backoff(self._backoff.until), None  # it was answered: the path works
        self.reached = True
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
            timed_out = ResultTimeout(self.queue, self.job_id, self.timeout or 0.0)
            if self._error is not None:  # the server was out of reach when time ran out: say why
                raise timed_out from self._error
            raise timed_out
        return left

    def listen(self, now: float) -> float:
        """How long the driver may wait for its next message: to the safety net's read, or the deadline."""
        left = self.remaining(now)
        until_read = max(self.read_by - now, 0.0)
        return until_read if left is None else min(left, until_read)

    def heard(self, message: Any, now: float) -> bool:
        """Whether to read the row now: a (re)subscription's confirmation, the announcement, or time."""
        if message is not None:
            self.reached = True
        return is_confirmation(message) or is_announcement(message) or now >= self.read_by

    def lost(self, error: BaseException, now: float) -> float:
        """The connection failed: the pause before subscribing again (``ResultTimeout`` at the deadline)."""
        self._error = error
        self.remaining(now)
        pause = self._backoff.next_wait(now)
        return 0.0 if pause is None else pause


def is_announcement(message: Any) -> bool:
    """A pub/sub message that announces the end (not a subscription's confirmation)."""
    return isinstance(message, dict) and message.get("type") in ("message", "smessage")


def is_confirmation(message: Any) -> bool:
    return isinstance(message, dict) and message.get("type") in ("subscribe", "ssubscribe")
