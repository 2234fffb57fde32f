"""A thread worker's pushed cancels: the ``<base>cancel`` subscription, kept alive.

EMQ.CANCEL publishes a job's id on ``<base>cancel`` when it records a
request for a running job; a worker holding that job checkpoints it at
once, which delivers the reason to the handler's token (fenced as any
checkpoint).  A lost message or a lost subscription is harmless: the lease
keeper's next checkpoint delivers the cancel anyway.

A subscription can die without a word (a half-open connection: nothing
arrives, nothing fails), so while the worker holds jobs a silent one is
pinged, and one that does not answer is given up and made again
(``_runtime.SubscriptionHealth``).  After any lost subscription every held
job is checkpointed at once: a cancel published meanwhile is delivered
then, not an interval later.  That includes one redis-py made again by
itself on a connection it reconnected (where its retries are on, as on a
cluster client's): its second confirmation says so.  The subscription's connection is its own,
its every step bounded (``_attempt.SUBSCRIBER_TIMEOUT_S``), and ``close()``
cuts it: a stopping worker never waits on it.  The cut is undone before the
connection goes back to its pool: on a cluster client (or a single-connection
one) that pool is the client's own, and a connection left with the cut's 1 ms
timeouts made the client's next commands time out on a busy machine.

Hand-written beside its twin ``asyncio/_pushes.py``, not generated from it
(``tests/unasync.py``): a thread reads the subscription with blocking reads and a timeout,
a task awaits its messages; the health rules are ``_runtime``'s.
"""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from collections.abc import Callable
from typing import Any

import redis

from .. import _protocol as proto
from .._runtime import SubscriptionHealth, worker_log
from .._runtime.pushes import CANCEL_POLL_S
from ..schedules import changes_channel
from .client import Client
from .lease import SharedKeeper

__all__ = ["CANCEL_POLL_S", "CancelListener"]

# How long close() waits for the thread, once it cut its connection.
CLOSE_JOIN_S = 2.0


class CancelListener:
    """One thread per worker that turns ``<base>cancel`` messages into checkpoints of the jobs it holds."""

    def __init__(
        self,
        client: Client,
        queue: str,
        keepers: SharedKeeper,
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
        self._done = threading.Event()
        self._lock = threading.Lock()
        self._pubsub: Any = None
        # The cut connection and the timeouts it had (under _lock: _drop restores them).
        self._cut: tuple[Any, float | None, float | None] | None = None
        self._thread: threading.Thread | None = None
        self.resubscribed = 0  # subscriptions made again after one was lost (or found dead)

    def ensure(self) -> None:
        """Start the thread if it is not running (a thread that could not start is tried again)."""
        if self._done.is_set() or (self._thread is not None and self._thread.is_alive()):
            return
        thread = threading.Thread(target=self._run, name=f"echomq-worker-{self.queue}-cancels", daemon=True)
        try:
            thread.start()
        except RuntimeError as exc:  # the checkpoints deliver meanwhile; the supervisor tries again
            worker_log.debug("worker of %r: cannot start the cancel listener: %r", self.queue, exc)
            return
        self._thread = thread

    def listen_to(self, queues: tuple[str, ...]) -> None:
        """Hear the cancels of ``queues`` instead (a partitioned queue's partitions), from the next
        subscription on (made at once; a cancel between the two is asked for by a checkpoint)."""
        self._cancels = {proto.keys_of(queue).base + "cancel" for queue in queues}
        self._channel = proto.keys_of(queues[0]).base + "cancel"
        self._channels = [*sorted(self._cancels), *(c for c in self._channels if not c.endswith(":cancel"))]
        self._renew = True

    def close(self) -> None:
        """Stop listening: cut the subscription's connection, and wait (bounded) for the thread."""
        self._done.set()
        with self._lock:
            connection = getattr(self._pubsub, "connection", None)
            if connection is not None and self._cut is None:
                # redis-py's PubSub reconnects once after a failed read: make that one
                # fail at once rather than wait on a frozen server.  Under the lock, and
                # undone by _drop before the connection goes back to its pool.
                self._cut = (connection, connection.socket_timeout, connection.socket_connect_timeout)
                connection.socket_connect_timeout = connection.socket_timeout = 0.001
            sock = getattr(connection, "_sock", None)
            if sock is not None:  # a read or a handshake blocked on it returns now
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)
        thread = self._thread
        if thread is not None and thread.ident is not None:
            thread.join(CLOSE_JOIN_S)

    def _run(self) -> None:
        lost = False
        health = SubscriptionHealth(time.monotonic())
        while not self._done.is_set():
            try:
                pubsub = self._pubsub
                if self._renew and pubsub is not None:  # other channels (listen_to): subscribed anew
                    self._renew, lost, pubsub = False, True, None
                    self._drop()
                if pubsub is None:
                    pubsub = self.client._subscriber(confirmations=True)
                    with self._lock:
                        self._pubsub = pubsub
                    pubsub.subscribe(*self._channels)
                    health = SubscriptionHealth(time.monotonic())
                    if lost:  # a cancel published while nobody listened: every held job asks now
                        lost = False
                        self.resubscribed += 1
                        self._keepers.checkpoint_all()
                message = pubsub.get_message(timeout=CANCEL_POLL_S)
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
                    pubsub.ping()
                elif verdict == "dead":
                    raise redis.ConnectionError("the cancel subscription answered no PING (half-open?)")
            except Exception as exc:  # the checkpoints deliver meanwhile; subscribe again soon
                if not self._done.is_set():
                    worker_log.debug("worker of %r: cancel subscription: %r", self.queue, exc)
                if isinstance(exc, (redis.ConnectionError, redis.TimeoutError, OSError)):
                    # the worker's other connections on the same path may be half-open too
                    self.client._distrust()
                self._drop()
                lost = True
                self._done.wait(CANCEL_POLL_S)
        self._drop()

    def _drop(self) -> None:
        with self._lock:
            pubsub, self._pubsub = self._pubsub, None
            cut, self._cut = self._cut, None
            if cut is not None:  # nobody reads on it any more: its own timeouts again
                connection, timeout, connect_timeout = cut
                connection.socket_timeout, connection.socket_connect_timeout = timeout, connect_timeout
        if pubsub is not None:
            with contextlib.suppress(Exception):
                pubsub.close()
