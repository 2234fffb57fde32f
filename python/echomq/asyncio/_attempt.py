"""A worker's bounded attempts (asyncio): one try of a command, or of a pipeline, on its own connections.

The twin of ``echomq._attempt`` for ``redis.asyncio``: the worker's
connections, made with the caller's settings but without redis-py's
retries, at most ``limit`` at once (what its workers reserved, never more
than the caller's ``max_connections``); a try waits for a free one, then
connects, sends and reads, all under one deadline (the caller's
``asyncio.timeout``).  A try that timed out before anything was sent, or
could not connect, is ``NotSent``: nothing ran.  After a timeout the idle
connections are given up as well (they may be half-open), when next taken.

A worker keeps ``STOP_LANE`` of its connections for its own upkeep
(``lane`` tries: its stop's batches that give its jobs back, and its one
keeper's batch of checkpoints): no other try takes them, and a lane try
waiting for a connection goes before every other waiter, so a forced stop's
give-back never queues behind the traffic it is ending, nor the renewal of
every held lease behind a dry pool.

Hand-written beside its twin ``_sync/_attempt.py``, not generated from it
(``tests/unasync.py``): a thread's try sets a socket timeout for each step of redis-py's
blocking connection, a task's awaits run under one ``asyncio.timeout``; the pools differ
as redis-py's two do.
"""

from __future__ import annotations

import asyncio
import collections
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import redis
import redis.asyncio as aioredis
from redis.asyncio.retry import Retry as AsyncRetry
from redis.backoff import NoBackoff
from redis.exceptions import ResponseError

from .._runtime.tries import SPARE, SUBSCRIBER_TIMEOUT_S, WORKER_CONNECT_S, NotSent
from .._runtime.tries import pack as _pack

__all__ = ["STOP_LANE", "Progress", "WorkerConnections"]

# Connections of a worker's reservation only lane tries use: its stop's give-backs (two
# at once) and its keeper's checkpoints (one batch at a time).
STOP_LANE = 3


class Progress:
    """How far one try got: ``sent`` once its bytes may have left (a timeout then is a lost reply).

    ``timer`` is the try's ``asyncio.timeout`` (Python 3.11+): ``stretch``
    moves its end later (a forced stop lets a try in flight hear its answer).
    """

    __slots__ = ("sent", "timer")

    def __init__(self) -> None:
        self.sent = False
        self.timer: Any = None

    def stretch(self, until: float) -> None:
        """Let the try wait until ``until`` (``time.monotonic``) if that is later than its own end.

        A try whose timeout already fired (the task not yet woken to see it)
        or that left its block is not stretched: it has ended, and asyncio
        refuses to move such a timer (RuntimeError).
        """
        timer = self.timer
        if timer is None or timer.expired():
            return
        when = timer.when()
        if when is None:
            return
        loop_until = asyncio.get_running_loop().time() + (until - time.monotonic())
        if loop_until > when:
            try:
                timer.reschedule(loop_until)
            except RuntimeError:  # the try left its block (an exited timer): nothing in flight
                return


class WorkerConnections:
    """The connections behind an asyncio client's bounded attempts (see ``echomq._attempt``)."""

    def __init__(self, base: aioredis.ConnectionPool) -> None:
        options = dict(base.connection_kwargs)
        options["retry"] = AsyncRetry(NoBackoff(), 0)
        for name in ("socket_timeout", "socket_connect_timeout"):
            given = options.get(name)
            options[name] = WORKER_CONNECT_S if given is None else min(float(given), WORKER_CONNECT_S)
        self._subscriber_options = dict(options)
        # No socket timeout on a try's connections: its deadline (the caller's asyncio.timeout)
        # bounds every step, the connect's handshake and the send included.  With one, redis-py
        # sends through asyncio.wait_for, which before Python 3.12 returns the send's result and
        # drops a cancel that comes as the send completes: the try, its timeout spent, then read
        # for ever (a waiting claim, a batch on a half-open connection).  socket_connect_timeout
        # stays: redis-py bounds a connect's TCP handshake and a disconnect with asyncio.timeout.
        options["socket_timeout"] = None
        self._options = options
        self._class = base.connection_class
        self.cap = max(1, int(getattr(base, "max_connections", 0) or 2**31))
        self._idle: list[tuple[Any, int]] = []
        self._busy = 0
        self._lane_busy = 0  # of _busy: lane tries on the lane's own connections
        self._reserved = 0
        self._lanes = 0  # of _reserved: kept for lane tries
        self._generation = 0  # bumped by drop_idle(): older idle connections are closed when taken
        self._waiters: collections.deque[asyncio.Future[None]] = collections.deque()
        self._lane_waiters: collections.deque[asyncio.Future[None]] = collections.deque()
        self._subscribers: aioredis.ConnectionPool | None = None

    @property
    def limit(self) -> int:
        return self.cap if self._reserved == 0 else min(self.cap, self._reserved + SPARE)

    @property
    def lane(self) -> int:
        """Connections of ``limit`` only lane tries take (never all of them: others need one too)."""
        return min(self._lanes, self.limit - 1)

    def reserve(self, n: int, lanes: int = 0) -> None:
        """``n`` more connections, ``lanes`` of them (counted in ``n``) kept for lane tries."""
        self._reserved += n
        self._lanes += lanes
        self._wake()

    def unreserve(self, n: int, lanes: int = 0) -> None:
        self._reserved = max(0, self._reserved - n)
        self._lanes = max(0, self._lanes - lanes)

    def drop_idle(self) -> None:
        """The idle connections may be half-open: each is closed, not used, when next taken."""
        self._generation += 1

    async def aclose(self) -> None:
        idle, self._idle = self._idle, []
        for connection, _ in idle:
            await connection.disconnect()
        if self._subscribers is not None:
            await self._subscribers.disconnect()

    def subscriber(self, confirmations: bool = False) -> Any:
        """A PubSub on a connection of its own (a worker's pushed cancels, a result wait), every step bounded.

        ``confirmations``: hand the subscriptions' confirmations up too (a
        result wait reads its row again on each).
        """
        if self._subscribers is None:
            options = dict(self._subscriber_options)
            for name in ("socket_timeout", "socket_connect_timeout"):
                options[name] = min(options[name], SUBSCRIBER_TIMEOUT_S)
            self._subscribers = aioredis.ConnectionPool(connection_class=self._class, **options)
        return aioredis.Redis(connection_pool=self._subscribers).pubsub(
            ignore_subscribe_messages=not confirmations
        )

    def _room(self, lane: bool) -> bool:
        """Whether a try may take a connection now: a lane try any of ``limit``, others all but the lane's."""
        if lane:
            return self._busy < self.limit
        return self._busy - self._lane_busy < self.limit - self.lane

    def _wake(self) -> None:
        for waiters, lane in ((self._lane_waiters, True), (self._waiters, False)):
            while waiters and self._room(lane):
                waiter = waiters.popleft()
                if not waiter.done():
                    waiter.set_result(None)
                    return

    @asynccontextmanager
    async def connection(self, progress: Progress, lane: bool = False) -> AsyncIterator[Any]:
        """A connected connection (the caller's timeout bounds the wait); ``NotSent`` if it cannot connect.

        ``lane``: a stop's try (see the module docstring).
        """
        while not self._room(lane):
            waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            (self._lane_waiters if lane else self._waiters).append(waiter)
            try:
                await waiter
            except BaseException:
                if waiter.done() and not waiter.cancelled():
                    self._wake()  # our turn came as we were cancelled: the next one's
                raise
        # A lane try counts on the lane's connections only when the others' are all taken.
        on_lane = lane and self._busy - self._lane_busy >= self.limit - self.lane
        self._busy += 1
        self._lane_busy += on_lane
        generation = self._generation
        connection: Any = None
        clean = False
        try:
            while self._idle:
                candidate, born = self._idle.pop()
                if born == generation and await _usable(candidate):
                    connection = candidate
                    break
                await candidate.disconnect()
            if connection is None:
                connection = self._class(**self._options)
                try:
                    await connection.connect()
                except (redis.ConnectionError, redis.TimeoutError, OSError) as exc:
                    raise NotSent(f"could not connect: {exc}") from exc
            yield connection
            clean = True
        finally:
            self._busy -= 1
            self._lane_busy -= on_lane
            self._wake()
            if connection is not None:
                if clean and generation == self._generation:
                    self._idle.append((connection, generation))
                else:
                    await connection.disconnect(nowait=True)

    @staticmethod
    async def round_trip(connection: Any, commands: list[tuple[Any, ...]], progress: Progress) -> list[Any]:
        """Send ``commands`` pipelined and read every reply; error replies are values (ResponseError)."""
        progress.sent = True
        # The try's own deadline (the caller's asyncio.timeout) bounds the send and the reads:
        # the connection has no socket timeout (see __init__); a waiting claim (BLOCK) may wait
        # longer than any.
        await connection.send_packed_command(_pack(connection, commands), check_health=False)
        replies: list[Any] = []
        for _ in commands:
            try:
                replies.append(await connection.read_response())
            except ResponseError as exc:
                replies.append(exc)
        return replies


async def _usable(connection: Any) -> bool:
    """An idle connection still open, with no bytes nobody asked for (the server may have closed it)."""
    if not connection.is_connected:
        return False
    peek = getattr(connection, "can_read", None) or connection.can_read_destructive  # can_read: redis-py 8
    try:
        return not await peek()
    except (redis.RedisError, OSError):
        return False
