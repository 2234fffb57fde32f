"""A thread worker's schedule driver: its queue's schedule ticks fired on time, not at its sweeps.

With ``reap=True`` (the default) a worker runs one thread that reads the
queue's earliest next tick (``<base>schedules``, scored with each schedule's
next tick) and the server's time, sleeps until that tick, and drives the due
schedules then (``_schedules.drive``: one transaction per schedule, once
whatever the number of drivers).  A schedule added, replaced or removed is
published on ``<base>schedules`` (a channel); the worker's cancel listener
hears it and wakes the driver, which reads the next tick again.  A driver
that hears nothing (a lost message, no listener) reads it again at least
every ``schedules.RECHECK_S`` (``RECHECK_UNTOLD_S`` without a listener).

Hand-written beside its twin ``asyncio/_ticks.py``, not generated from it
(``tests/unasync.py``): a thread waits on an ``Event`` where asyncio has one task,
cancelled at the stop.
"""

from __future__ import annotations

import contextlib
import socket
import threading
from typing import Any

import redis

from .. import schedules as rules
from .._runtime import WorkerCore
from ._schedules import drive, next_tick
from .client import Client

__all__ = ["TickDriver"]

# How long stop() waits for the thread (a drive in flight ends with its commands' own timeouts).
JOIN_S = 2.0


class TickDriver:
    """One thread that fires a worker's queue's schedule ticks when they come, until ``stop()``."""

    def __init__(self, worker: WorkerCore[Client, Any], told: bool) -> None:
        self.worker = worker
        self._recheck = rules.RECHECK_S if told else rules.RECHECK_UNTOLD_S
        self._done = threading.Event()
        self._wake = threading.Event()
        self._thread: threading.Thread | None = None
        self._pool, self.client = own_client(worker.client)

    def start(self) -> None:
        self._thread = threading.Thread(
            target=self._run, name=f"echomq-worker-{self.worker.queue}-ticks", daemon=True
        )
        self._thread.start()

    def changed(self) -> None:
        """A schedule of the queue changed (its channel said so): read the next tick again now."""
        self._wake.set()

    def cut(self) -> None:
        """No drive from now on, the one in flight cut (from any thread, never waits)."""
        self._done.set()
        self._wake.set()
        for connection in list(getattr(self._pool, "_in_use_connections", ())):
            sock = getattr(connection, "_sock", None)
            if sock is not None:  # a read blocked on a frozen server returns now
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)

    def stop(self) -> None:
        """``cut()``, and wait (bounded) for the thread."""
        self.cut()
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(JOIN_S)
        if self._pool is not None:
            self._pool.disconnect()

    def _run(self) -> None:
        while not self._done.is_set():
            self._wake.clear()
            self._wake.wait(self.turn())

    def turn(self) -> float:
        """Drive the due ticks, if any; the seconds until the next one (at most the recheck)."""
        worker, client = self.worker, self.client
        try:
            next_ms, now_ms = next_tick(client, worker.queue)
            if next_ms is None or next_ms > now_ms:
                return rules.wait_s(next_ms, now_ms, self._recheck)
            result = drive(client, worker.queue)
            rules.tell_drive(worker.queue, result)
            next_ms, now_ms = next_tick(client, worker.queue)
        except Exception as exc:  # the server away, a bug of ours: told (once); the next turn comes
            if not self._done.is_set():
                worker._trouble(exc, "schedules")
            return rules.RETRY_S
        if next_ms is not None and next_ms <= now_ms:  # still due: a row it could not fire (told)
            return rules.RETRY_S
        return rules.wait_s(next_ms, now_ms, self._recheck)


def own_client(client: Client) -> tuple[redis.ConnectionPool | None, Client]:
    """The driver's client: on connections of its own (a transaction holds one under WATCH), each
    step bounded as the worker's attempts are, and cut at the stop; a client whose connections
    are not the worker's own to make (a cluster's) is used as it is."""
    if not client._bounded():
        return None, client
    connections = client._connections()
    options = connections._options
    pool = redis.ConnectionPool(connection_class=connections._class, max_connections=2, **options)
    own = type(client)(redis.Redis(connection_pool=pool), script_limits=client._limits)
    own._rendering = client._rendering
    return pool, own
