"""A worker's bounded attempts (threads): one try of a command, or of a pipeline, within a deadline.

A worker retries every command itself, on its own schedule, with the same
REQ or token each time (``_runtime.Backoff``); so each try here is one
round trip whose every step ends by a deadline: waiting for a connection,
connecting and shaking hands, sending, and reading each reply.  A reply
that does not come in time gives its connection up (it may be half-open)
and the idle ones with it, so the next try opens a fresh one.

The connections are the worker's own (``WorkerConnections``), made with
the caller's settings but without redis-py's retries, and at most
``limit`` of them at once: a worker reserves what it needs (its slots and
its own loops), never more than the caller's ``max_connections``.  A try
that finds none free waits for one within its deadline; it then fails
with ``NotSent`` (nothing left: a claim's REQ has nothing to resolve).

The read's deadline is set on the socket itself rather than passed to
``read_response(timeout=...)``, which redis-py before 6.0 does not take.

Hand-written beside its twin ``asyncio/_attempt.py``, not generated from it
(``tests/unasync.py``): a thread's try sets a socket timeout for each step of redis-py's
blocking connection, a task's awaits run under one ``asyncio.timeout``; the pools differ
as redis-py's two do.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import redis
from redis.backoff import NoBackoff
from redis.exceptions import ResponseError
from redis.retry import Retry

from .._runtime.tries import SPARE, SUBSCRIBER_TIMEOUT_S, WORKER_CONNECT_S, NotSent, pack

__all__ = ["Cutter", "NodeConnections", "NotSent", "WorkerConnections", "read_within"]

class Cutter:
    """The connection a bounded attempt is reading from, so another thread can cut it short.

    ``cut()`` (from any thread) disconnects it: a read blocked on a half-open
    connection returns at once with an error instead of waiting out the
    socket timeout.  After ``cut()`` no attempt starts with this cutter.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._connection: Any = None
        self.done = False

    def hold(self, connection: Any) -> bool:
        with self._lock:
            if self.done:
                return False
            self._connection = connection
            return True

    def drop(self) -> None:
        with self._lock:
            self._connection = None

    def cut(self) -> bool:
        """Cut the attempt in progress, if any (True then); no attempt starts with this cutter after it."""
        # Under the lock: the owner releases its connection to the pool only
        # after drop(), so this never disconnects a connection someone else
        # has taken from the pool since.
        with self._lock:
            self.done = True
            connection, self._connection = self._connection, None
            if connection is not None:
                connection.disconnect()
            return connection is not None


def read_within(connection: Any, deadline: float) -> Any:
    """``connection.read_response()``, waiting no later than ``deadline`` (``time.monotonic``).

    The socket's own timeout bounds the read: every redis-py from 5.0 reads
    through it, whether the parser is hiredis or Python's.  A ResponseError
    (an error reply) is raised as redis-py raises it; a timeout disconnects
    the connection and raises ``redis.TimeoutError``.
    """
    sock = connection._sock
    if sock is None:
        raise redis.ConnectionError("the connection was closed")
    sock.settimeout(max(deadline - time.monotonic(), 0.001))
    return connection.read_response()


class WorkerConnections:
    """The connections behind a client's bounded attempts: the caller's settings, no retries, a limit.

    ``limit`` is what the workers on this client reserved (``reserve``),
    plus ``SPARE``, never above the caller's pool's ``max_connections``;
    with no worker, the caller's limit.  Thread-safe.
    """

    def __init__(self, base: redis.ConnectionPool) -> None:
        options = dict(base.connection_kwargs)
        options["retry"] = Retry(NoBackoff(), 0)
        for name in ("socket_timeout", "socket_connect_timeout"):
            given = options.get(name)
            options[name] = WORKER_CONNECT_S if given is None else min(float(given), WORKER_CONNECT_S)
        self._options = options
        self._class = base.connection_class
        self.cap = max(1, int(getattr(base, "max_connections", 0) or 2**31))
        # Its sections take the lock itself (C), not the Condition's Python __enter__/__exit__.
        self._mutex = threading.RLock()
        self._cond = threading.Condition(self._mutex)
        self._idle: list[Any] = []
        self._busy = 0
        self._takers = 0  # tries waiting in take() for a connection
        self._reserved = 0
        self._generation = 0  # bumped by drop_idle(): connections older than it are not kept
        self._subscribers: redis.ConnectionPool | None = None

    @property
    def limit(self) -> int:
        """How many connections may be open at once now."""
        return self.cap if self._reserved == 0 else min(self.cap, self._reserved + SPARE)

    def reserve(self, n: int) -> None:
        """A worker starts: ``n`` more connections may be open at once (within the caller's limit)."""
        with self._mutex:
            self._reserved += n
            self._cond.notify_all()

    def unreserve(self, n: int) -> None:
        with self._mutex:
            self._reserved = max(0, self._reserved - n)

    def drop_idle(self) -> None:
        """Close the idle connections (after a timeout they may be half-open too)."""
        with self._mutex:
            idle, self._idle = self._idle, []
            self._generation += 1
        for connection in idle:
            connection.disconnect()

    def subscriber(self, confirmations: bool = False) -> Any:
        """A PubSub on a connection of its own (a worker's pushed cancels, a result wait), every step bounded.

        ``confirmations``: hand the subscriptions' confirmations up too (a
        result wait reads its row again on each).
        """
        with self._mutex:
            pool = self._subscribers
            if pool is None:
                options = dict(self._options)
                for name in ("socket_timeout", "socket_connect_timeout"):
                    options[name] = min(options[name], SUBSCRIBER_TIMEOUT_S)
                pool = self._subscribers = redis.ConnectionPool(connection_class=self._class, **options)
        return redis.Redis(connection_pool=pool).pubsub(ignore_subscribe_messages=not confirmations)  # type: ignore[no-untyped-call,unused-ignore]

    def close(self) -> None:
        self.drop_idle()
        if self._subscribers is not None:
            self._subscribers.disconnect()

    @contextmanager
    def connection(self, deadline: float) -> Iterator[Any]:
        """A connected connection, within ``deadline``; ``NotSent`` if none could be had in time.

        It goes back to the idle ones after a clean use, and is closed after
        an error (the caller's exception propagates).
        """
        connection, generation = self.take(deadline)
        clean = False
        try:
            yield connection
            clean = True
        finally:
            self.give(connection, generation, clean)

    def take(self, deadline: float) -> tuple[Any, int]:
        """``connection()``'s first half, for the worker's hot path: a connection and its generation."""
        with self._mutex:
            while self._busy >= self.limit:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise NotSent(f"no free connection within the attempt's time ({self.limit} in use)")
                self._takers += 1
                try:
                    self._cond.wait(left)
                finally:
                    self._takers -= 1
            self._busy += 1
            generation = self._generation
            connection = self._idle.pop() if self._idle else None
        try:
            if connection is None or _stale(connection):
                connection = connection or self._class(**self._options)
                self._connect(connection, deadline)
        except BaseException:
            self.give(connection, generation, False)
            raise
        return connection, generation

    def give(self, connection: Any, generation: int, clean: bool) -> None:
        """``connection()``'s second half: kept after a clean use (of this generation), else closed."""
        with self._mutex:
            self._busy -= 1
            keep = clean and generation == self._generation and connection is not None
            if keep:
                self._idle.append(connection)
            if self._takers:  # a notify with nobody waiting is a Python call for nothing, each try
                self._cond.notify()
        if not keep and connection is not None:
            connection.disconnect()

    @staticmethod
    def _connect(connection: Any, deadline: float) -> None:
        left = deadline - time.monotonic()
        if left <= 0:
            raise NotSent("no time left to connect")
        # A frozen server's kernel accepts the connection and nothing answers
        # the handshake: both are bounded by what the try has left.
        timeout = min(left, WORKER_CONNECT_S)
        connection.socket_connect_timeout = timeout
        connection.socket_timeout = timeout
        try:
            connection.connect()
        except (redis.ConnectionError, redis.TimeoutError, OSError) as exc:
            connection.disconnect()
            raise NotSent(f"could not connect: {exc}") from exc

    def round_trip(
        self, connection: Any, commands: list[tuple[Any, ...]], deadline: float, cutter: Cutter | None = None
    ) -> list[Any]:
        """Send ``commands`` pipelined on ``connection`` and read every reply by ``deadline``.

        Error replies are values (ResponseError).  ``cutter`` lets another
        thread end the wait (the connection is then disconnected: a
        ConnectionError).  Connection trouble and timeouts raise.
        """
        if cutter is not None and not cutter.hold(connection):
            raise NotSent("the attempt was cut before it started")
        try:
            sock = connection._sock
            if sock is None:
                raise NotSent("the connection was closed")
            sock.settimeout(max(deadline - time.monotonic(), 0.001))
            connection.send_packed_command(pack(connection, commands), check_health=False)
            replies: list[Any] = []
            for _ in commands:
                try:
                    replies.append(read_within(connection, deadline))
                except ResponseError as exc:
                    replies.append(exc)
            return replies
        except redis.RedisError:
            raise
        except Exception as exc:  # a cut from another thread tore the parser down mid-read
            connection.disconnect()
            raise redis.ConnectionError(f"the attempt was cut: {exc!r}") from exc
        finally:
            if cutter is not None:
                cutter.drop()


def _stale(connection: Any) -> bool:
    """An idle connection the server closed (or that has bytes nobody asked for): not to be used."""
    if connection._sock is None:
        return True
    try:
        if connection.can_read(0):
            connection.disconnect()
            return True
    except (redis.RedisError, OSError):
        connection.disconnect()
        return True
    return False


class NodeConnections:
    """On Redis Cluster, bounded connections of one's own to each node (``WorkerConnections`` over
    the node's pool in redis-py's cluster client), so that a worker's waiting claim there can be
    cut by its stop (``Cutter``) as on one server.

    ``detour``: a try there failed (no answer, or a redirect), so the next
    goes through redis-py's routing, which follows a redirect and finds a
    failed-over node; set back once that has reached the slot's node.
    """

    def __init__(self) -> None:
        self._pools: dict[str, tuple[redis.ConnectionPool, WorkerConnections]] = {}
        self.detour = False

    def for_key(self, cluster: Any, key: Any) -> WorkerConnections | None:
        """The connections to the node serving ``key``'s slot, None where redis-py knows none."""
        if self.detour:
            return None
        try:
            node = cluster.get_node_from_key(key)
        except (redis.RedisError, IndexError, KeyError):  # a slot redis-py does not know yet
            return None
        base = getattr(node, "redis_connection", None) if node is not None else None
        if not isinstance(base, redis.Redis):
            return None
        known = self._pools.get(node.name)
        if known is None or known[0] is not base.connection_pool:  # new, or redis-py made it again
            pool = base.connection_pool
            known = self._pools[node.name] = (pool, WorkerConnections(pool))
        return known[1]

    def close(self) -> None:
        for _, connections in self._pools.values():
            connections.close()
        self._pools.clear()
