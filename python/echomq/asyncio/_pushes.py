"""An asyncio worker's pushed cancels: the ``<base>cancel`` subscription, kept alive.

The twin of ``echomq._pushes``: a message checkpoints its job at once; a
silent subscription is pinged while the worker holds jobs, and one that
does not answer is given up and made again, every held job then
checkpointed (``_runtime.SubscriptionHealth``), as after one redis-py made
again by itself (its second confirmation); its connection is its own,
every step bounded.

Hand-written beside its twin ``_sync/_pushes.py``, not generated from it
(``tests/unasync.py``): a thread reads the subscription with blocking reads and a timeout,
a task awaits its messages; the health rules are ``_runtime``'s.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable
from typing import Any

import redis

from .. import _protocol as proto
from .._runtime import SubscriptionHealth, worker_log
from .._runtime.pushes import CANCEL_POLL_S
from ..schedules import changes_channel
from .client import Client
from .lease import Keepers

__all__ = ["CancelListener"]


class CancelListener:
    """One task per worker that turns ``<base>cancel`` messages into checkpoints of the jobs it holds."""

    def __init__(
        self,
        client: Client,
        queue: str,
        keepers: Keepers,
        holding: Callable[[], bool],
        on_schedules: Callable[[], None] | None = None,
    ) -> None:
        self.client, self.queue = client, queue
        self._keepers, self._holding = keepers, holding
        self._channel = proto.keys_of(queue).base + "cancel"
        # The queue's schedule changes, heard on the same connection (the worker's tick driver).
        self._on_schedules = on_schedules
        self._channels = [self._channel] + ([changes_channel(queue)] if on_schedules is not None else [])
        self._cancels = {self._channel}  # a partitioned queue's worker hears every partition's (listen_to)
        self._renew = False  # listen_to asked for a new subscription
        self._listening = True
        self._task: asyncio.Task[None] | None = None
        self.resubscribed = 0

    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name=f"echomq-worker-{self.queue}-cancels")

    def listen_to(self, queues: tuple[str, ...]) -> None:
        """Hear the cancels of ``queues`` instead (see ``_sync/_pushes.CancelListener.listen_to``)."""
        self._cancels = {proto.keys_of(queue).base + "cancel" for queue in queues}
        self._channel = proto.keys_of(queues[0]).base + "cancel"
        self._channels = [*sorted(self._cancels), *(c for c in self._channels if not c.endswith(":cancel"))]
        self._renew = True

    async def close(self) -> None:
        """Stop listening; it looks up every ``CANCEL_POLL_S`` (redis-py's pub/sub read does not always
        end when its task is cancelled): cancelled only if it does not end by itself soon."""
        self._listening = False
        task = self._task
        if task is None:
            return
        _, late = await asyncio.wait([task], timeout=CANCEL_POLL_S + 1.0)
        for t in late:
            t.cancel()
        if late:
            await asyncio.wait(late, timeout=1.0)

    async def _run(self) -> None:
        pubsub: Any = None
        lost = False
        health = SubscriptionHealth(time.monotonic())
        try:
            while self._listening:
                try:
                    if self._renew and pubsub is not None:  # other channels (listen_to): subscribed anew
                        self._renew, lost = False, True
                        with contextlib.suppress(Exception):
                            await _close(pubsub)
                        pubsub = None
                    if pubsub is None:
                        pubsub = self.client._subscriber(confirmations=True)
                        await pubsub.subscribe(*self._channels)
                        health = SubscriptionHealth(time.monotonic())
                        if lost:  # a cancel published while nobody listened: every held job asks now
                            lost = False
                            self.resubscribed += 1
                            self._keepers.checkpoint_all()
                    message = await pubsub.get_message(timeout=CANCEL_POLL_S)
                    now = time.monotonic()
                    if message is not None:
                        health.heard_from(now)
                        kind = message.get("type")
                        channel = proto.text(message.get("channel", b""))
                        ours = channel == self._channel or channel in self._cancels
                        if kind == "message" and ours:
                            self._keepers.pushed(proto.text(message["data"]))
                        elif kind == "subscribe" and channel == self._channel and health.confirmed():
                            self.resubscribed += 1  # by redis-py, after a dropped connection
                            self._keepers.checkpoint_all()
                        if not ours and kind in ("message", "subscribe") and self._on_schedules is not None:
                            self._on_schedules()  # a change, or a new subscription (one missed meanwhile)
                    verdict = health.next(now, self._holding())
                    if verdict == "ping":
                        await pubsub.ping()
                    elif verdict == "dead":
                        raise redis.ConnectionError("the cancel subscription answered no PING (half-open?)")
                except (asyncio.CancelledError, KeyboardInterrupt, SystemExit):
                    raise
                except Exception as exc:  # the checkpoints deliver meanwhile; subscribe again soon
                    worker_log.debug("worker of %r: cancel subscription: %r", self.queue, exc)
                    if isinstance(exc, (redis.ConnectionError, redis.TimeoutError, OSError)):
                        self.client._distrust()  # the worker's other connections may be half-open too
                    if pubsub is not None:
                        with contextlib.suppress(Exception):
                            await _close(pubsub)
                    pubsub = None
                    lost = True
                    if self._listening:
                        await asyncio.sleep(CANCEL_POLL_S)
        finally:
            if pubsub is not None:
                with contextlib.suppress(Exception):
                    await _close(pubsub)


async def _close(pubsub: Any) -> None:
    closing = getattr(pubsub, "aclose", None) or pubsub.close  # aclose() from redis-py 5.0.1
    await closing()
