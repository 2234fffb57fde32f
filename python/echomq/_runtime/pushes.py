"""Whether a worker's pushed-cancel subscription still hears the server."""

from __future__ import annotations

# The pushed-cancel subscription, while the worker holds jobs: pinged when it
# has been silent this long, and given up (then subscribed again, and every
# held job checkpointed at once) when no answer comes within PONG_WITHIN_S.
# A half-open subscription is noticed within about their sum.
HEALTH_EVERY_S = 1.0
PONG_WITHIN_S = 1.0
# How often a listener looks up from its subscription (to see the worker stop, or ping): both drivers'.
CANCEL_POLL_S = 0.2


class SubscriptionHealth:
    """Whether a worker's pushed-cancel subscription still hears the server (a half-open one does not).

    Nothing comes on a quiet channel, so silence proves nothing: while the
    worker holds jobs (pushes matter only then), a subscription silent for
    ``HEALTH_EVERY_S`` is pinged, and one that answers nothing within
    ``PONG_WITHIN_S`` is dead.  An idle worker sends no pings.
    """

    def __init__(self, now: float) -> None:
        self.heard = now
        self.pinged: float | None = None
        self.confirmations = 0

    def confirmed(self) -> bool:
        """The subscription's confirmation came: True when it is not its first.

        redis-py subscribes again by itself when it reconnects a dropped
        connection (where its retries are on): a cancel published meanwhile
        was missed, and nothing failed to say so -- every held job asks now.
        """
        self.confirmations += 1
        return self.confirmations > 1

    def heard_from(self, now: float) -> None:
        """A message or a pong came."""
        self.heard, self.pinged = now, None

    def next(self, now: float, holding: bool) -> str:
        """``"ping"`` (send one now), ``"dead"`` (subscribe again), or ``"ok"``."""
        if self.pinged is not None:
            return "dead" if now - self.pinged >= PONG_WITHIN_S else "ok"
        if holding and now - self.heard >= HEALTH_EVERY_S:
            self.pinged = now
            return "ping"
        return "ok"
